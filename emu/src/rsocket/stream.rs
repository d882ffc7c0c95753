//! The data path of a connected rsocket: a receive ring the peer writes into, a staging
//! buffer our own writes go out of, and the credits that keep either from overflowing.
//!
//! Data goes as RDMA WRITE WITH IMMEDIATE into the peer's ring at its tail; the immediate
//! carries the length, and the zero-length receive it completes is posted again at once (it
//! only catches the immediate). A message never wraps the ring's end. The reader reports
//! what it has read, and how many data messages it took, in a credit message when half the
//! ring or half its messages are used up. Credit and FIN messages are few and use receives
//! kept aside for them; the QPs retry forever on receiver-not-ready, should they ever run
//! short.

use std::collections::VecDeque;

use super::wire::{Hello, IOMAP_ENTRY, IOMAP_TABLE, Imm, IoMapEntry, MAX_CREDITS};
use crate::{
    error::{Errno, Error, Result},
    objects::recv_queue::RecvWr,
    objects::{channel::CompChannel, context::Context, cq::Cq, mr::Mr, pd::Pd},
    qp::{Qp, QpCap, QpInitAttr, SendWr},
    types::{AccessFlags, QpType, Sge, Wc, WcFlags, WcStatus},
};

/// Largest data message (bigger writes go as several).
const MAX_MSG: usize = 1 << 16;
/// Receives kept aside for credit and FIN messages beyond the data messages announced.
const CTRL_RECVS: u32 = 8;

const SEND_WR: u64 = 1;
const RECV_WR: u64 = 2;

/// Sizes of a connection's queues and buffers (from the socket's options).
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizes {
    pub ring: usize,
    pub sbuf: usize,
    /// Data messages the peer may have outstanding to us.
    pub credits: u16,
    pub sq: u32,
}

/// A connection's verbs objects and the state of both directions.
#[derive(Debug)]
pub(super) struct Stream {
    pub pd: Pd,
    pub cq: Cq,
    pub comp: CompChannel,
    pub qp: Qp,
    /// Our receive ring, then the table of the peer's mappings we may write into.
    ring: Mr,
    ring_len: usize,
    sbuf: Mr,
    sbuf_len: usize,
    announced: u16,
    /// Slots of our table the peer may fill.
    table: u8,
    sq_depth: usize,

    // Receiving.
    head: usize,
    ready: usize,
    /// Read since the last credit message.
    freed: usize,
    /// Data messages taken since the last credit message.
    taken: u32,
    /// The peer shut its writing side down: reads end once `ready` is drained.
    pub fin_in: bool,

    // Sending.
    peer: Option<Hello>,
    tail: usize,
    space: usize,
    credits: u32,
    s_tail: usize,
    s_used: usize,
    /// Staging bytes each posted work request frees when it completes, oldest first.
    inflight: VecDeque<usize>,
    pub fin_out: bool,

    /// What broke the connection (a failed completion, a peer that broke the protocol).
    pub error: Option<Errno>,
    /// Our mappings for the peer (`riomap` with `PROT_WRITE`), by slot of the peer's table
    /// (as many slots as its hello offers).
    maps: Vec<Option<(Mr, IoMapEntry)>>,
    /// Mappings the peer cannot write (`PROT_NONE`): registered, announced to no one.
    quiet_maps: Vec<Mr>,
}

impl Stream {
    /// The objects of a connection on `ctx`.
    pub(super) fn new(ctx: &Context, sizes: Sizes, table: usize) -> Result<Stream> {
        let pd = ctx.alloc_pd()?;
        let comp = ctx.create_comp_channel()?;
        comp.set_nonblocking(true)?;
        let rq = u32::from(sizes.credits) + CTRL_RECVS;
        let cq = ctx.create_cq((sizes.sq + rq) as i32, Some(&comp), 0)?;
        let cap = QpCap {
            max_send_wr: sizes.sq,
            max_recv_wr: rq,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let init = QpInitAttr { sq_sig_all: true, ..QpInitAttr::new(QpType::RC, &cq, cap) };
        let qp = pd.create_qp(&init)?;
        let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        // Shared with the peer's process on a host fabric: it writes into the ring and pulls
        // from the send buffer through its view of them.
        let ring =
            Mr::register_owned_for_peers(&pd, sizes.ring + IOMAP_TABLE * IOMAP_ENTRY, remote)?;
        let sbuf = Mr::register_owned_for_peers(&pd, sizes.sbuf, AccessFlags::LOCAL_WRITE)?;
        Ok(Stream {
            pd,
            cq,
            comp,
            qp,
            ring,
            ring_len: sizes.ring,
            sbuf,
            sbuf_len: sizes.sbuf,
            announced: sizes.credits,
            table: table.min(IOMAP_TABLE) as u8,
            sq_depth: sizes.sq as usize,
            head: 0,
            ready: 0,
            freed: 0,
            taken: 0,
            fin_in: false,
            peer: None,
            tail: 0,
            space: 0,
            credits: 0,
            s_tail: 0,
            s_used: 0,
            inflight: VecDeque::new(),
            fin_out: false,
            error: None,
            maps: Vec::new(),
            quiet_maps: Vec::new(),
        })
    }

    /// Posts the receives (once the CM has the QP in INIT).
    pub(super) fn post_receives(&self) -> Result<()> {
        for _ in 0..u32::from(self.announced) + CTRL_RECVS {
            self.qp.post_recv(&RecvWr { wr_id: RECV_WR, sg_list: &[] })?;
        }
        Ok(())
    }

    /// What we tell the peer about ourselves.
    pub(super) fn hello(&self) -> Hello {
        Hello {
            iomaps: self.table,
            credits: self.announced,
            ring_len: self.ring_len as u32,
            ring_addr: self.ring.addr(),
            rkey: self.ring.rkey(),
        }
    }

    /// The peer's hello arrived: we may write to it.
    pub(super) fn set_peer(&mut self, h: Hello) {
        self.peer = Some(h);
        self.maps = (0..h.iomaps).map(|_| None).collect();
        self.space = h.ring_len as usize;
        self.credits = u32::from(h.credits.min(MAX_CREDITS));
    }

    /// Bytes waiting to be read.
    pub(super) fn readable(&self) -> usize {
        self.ready
    }

    /// Whether a write could go out now.
    pub(super) fn writable(&self) -> bool {
        self.peer.is_some()
            && self.credits > 0
            && self.space > 0
            && self.s_used < self.sbuf_len
            && self.inflight.len() < self.sq_depth
    }

    /// Whether everything posted has completed.
    pub(super) fn all_sent(&self) -> bool {
        self.inflight.is_empty()
    }

    fn broken(&mut self, e: Errno) {
        self.error.get_or_insert(e);
    }

    /// Takes every completion there is; whether any came.
    pub(super) fn process(&mut self) -> bool {
        let mut wcs = [Wc::default(); 32];
        let mut any = false;
        loop {
            let n = self.cq.poll(&mut wcs);
            for wc in &wcs[..n] {
                self.completion(wc);
            }
            any |= n > 0;
            if n < wcs.len() {
                break;
            }
        }
        self.give_credit();
        any
    }

    fn completion(&mut self, wc: &Wc) {
        if wc.wr_id == SEND_WR {
            let freed = self.inflight.pop_front().unwrap_or(0);
            self.s_used -= freed.min(self.s_used);
            if wc.status != WcStatus::SUCCESS && wc.status != WcStatus::WR_FLUSH_ERR {
                self.broken(Errno(libc::ECONNRESET));
            }
            return;
        }
        if wc.status != WcStatus::SUCCESS {
            if wc.status != WcStatus::WR_FLUSH_ERR {
                self.broken(Errno(libc::ECONNRESET));
            }
            return;
        }
        // The receive only caught the immediate: it can take the next one at once.
        if self.qp.post_recv(&RecvWr { wr_id: RECV_WR, sg_list: &[] }).is_err() {
            self.broken(Errno(libc::ECONNRESET));
        }
        let imm = wc.wc_flags.contains(WcFlags::WITH_IMM).then_some(wc.imm_data);
        match imm.and_then(Imm::decode) {
            Some(Imm::Data(len)) if len as usize <= self.ring_len - self.ready => {
                self.ready += len as usize;
                self.taken += 1;
            }
            Some(Imm::Credit { msgs, bytes }) => {
                self.credits += msgs;
                self.space += bytes as usize;
                let sent = self.peer.map_or(0, |p| p.ring_len as usize);
                if self.space > sent || self.credits > u32::from(MAX_CREDITS) {
                    self.broken(Errno(libc::EPROTO));
                }
            }
            Some(Imm::Fin) => self.fin_in = true,
            _ => self.broken(Errno(libc::EPROTO)),
        }
    }

    /// Sends a credit message when half the ring was read or half the announced messages
    /// were taken since the last one.
    fn give_credit(&mut self) {
        let due =
            self.freed >= self.ring_len / 2 || self.taken >= u32::from(self.announced).div_ceil(2);
        if !due || self.peer.is_none() || self.error.is_some() {
            return;
        }
        let msgs = self.taken.min(u32::from(MAX_CREDITS));
        let imm = Imm::Credit { msgs, bytes: self.freed as u32 };
        if self.post_control(imm) {
            self.taken -= msgs;
            self.freed = 0;
        }
    }

    /// Posts a zero-length message carrying `imm`; false if the send queue is full.
    fn post_control(&mut self, imm: Imm) -> bool {
        if self.inflight.len() >= self.sq_depth {
            return false;
        }
        let wr = SendWr::send(SEND_WR, &[]).with_imm(imm.encode());
        match self.qp.post_send(&wr) {
            Ok(()) => {
                self.inflight.push_back(0);
                true
            }
            Err(_) => {
                self.broken(Errno(libc::ECONNRESET));
                false
            }
        }
    }

    /// Ends our direction of the stream (FIN after everything written); false while the send
    /// queue is full.
    pub(super) fn send_fin(&mut self) -> bool {
        if self.fin_out {
            return true;
        }
        self.fin_out = self.post_control(Imm::Fin);
        self.fin_out
    }

    /// Room in the staging buffer for up to `want` contiguous bytes: its offset and size.
    fn stage(&self, want: usize) -> (usize, usize) {
        let n = want.min(self.sbuf_len - self.s_used).min(self.sbuf_len - self.s_tail);
        (self.s_tail, n)
    }

    /// Posts one write of `data` (staged first) to `remote_addr`/`rkey`, with `imm` or
    /// without.
    fn post_staged(&mut self, data: &[u8], remote_addr: u64, rkey: u32, imm: Option<Imm>) -> bool {
        let (at, n) = self.stage(data.len());
        debug_assert_eq!(n, data.len());
        if self.sbuf.write(at, data).is_err() {
            self.broken(Errno::EIO);
            return false;
        }
        let sge =
            [Sge { addr: self.sbuf.addr() + at as u64, length: n as u32, lkey: self.sbuf.lkey() }];
        let mut wr = SendWr::write(SEND_WR, &sge, remote_addr, rkey);
        if let Some(imm) = imm {
            wr = wr.with_imm(imm.encode());
        }
        if self.qp.post_send(&wr).is_err() {
            self.broken(Errno(libc::ECONNRESET));
            return false;
        }
        self.s_tail = (self.s_tail + n) % self.sbuf_len;
        self.s_used += n;
        self.inflight.push_back(n);
        true
    }

    /// Writes what fits of `data` to the peer's ring now: the bytes taken (0 when there is
    /// no room at all).
    pub(super) fn send(&mut self, data: &[u8]) -> usize {
        let mut done = 0;
        while done < data.len() && self.writable() && self.error.is_none() {
            let peer = self.peer.expect("writable");
            let want = (data.len() - done)
                .min(self.space)
                .min(peer.ring_len as usize - self.tail)
                .min(MAX_MSG);
            let n = self.stage(want).1;
            let at = peer.ring_addr + self.tail as u64;
            if n == 0
                || !self.post_staged(
                    &data[done..done + n],
                    at,
                    peer.rkey,
                    Some(Imm::Data(n as u32)),
                )
            {
                break;
            }
            self.tail = (self.tail + n) % peer.ring_len as usize;
            self.space -= n;
            self.credits -= 1;
            done += n;
        }
        done
    }

    /// Copies up to `out.len()` received bytes out; with `peek` they stay to be read again.
    pub(super) fn recv(&mut self, out: &mut [u8], peek: bool) -> usize {
        let n = out.len().min(self.ready);
        let first = n.min(self.ring_len - self.head);
        let ok = self.ring.read(self.head, &mut out[..first]).is_ok()
            && self.ring.read(0, &mut out[first..n]).is_ok();
        if !ok {
            self.broken(Errno::EIO);
            return 0;
        }
        if !peek {
            self.head = (self.head + n) % self.ring_len;
            self.ready -= n;
            self.freed += n;
            self.give_credit();
        }
        n
    }

    /// Maps `mr` for the peer's `riowrite`s at `offset` (`announce`: into a free slot of the
    /// peer's table, else only kept). `ENOMEM` when every slot is taken (or there are none:
    /// the peer's `RDMA_IOMAPSIZE` was 0 when the connection was made); `EINVAL` before the
    /// peer's hello came.
    pub(super) fn map(&mut self, mr: Mr, offset: u64, announce: bool) -> Result<()> {
        if !announce {
            self.quiet_maps.push(mr);
            return Ok(());
        }
        if self.peer.is_none() {
            return Err(Error::new(Errno::EINVAL, "not connected yet"));
        }
        let Some(slot) = self.maps.iter().position(Option::is_none) else {
            return Err(Error::new(Errno::ENOMEM, "no free I/O mapping slot (RDMA_IOMAPSIZE)"));
        };
        let entry = IoMapEntry {
            offset,
            addr: mr.addr(),
            len: mr.length() as u64,
            rkey: mr.rkey(),
            valid: true,
        };
        self.write_entry(slot, &entry)?;
        self.maps[slot] = Some((mr, entry));
        Ok(())
    }

    /// Tells the peer's table what slot `slot` now holds.
    fn write_entry(&mut self, slot: usize, entry: &IoMapEntry) -> Result<()> {
        let peer = self.peer.ok_or(Error::new(Errno(libc::ENOTCONN), "not connected"))?;
        if self.stage(IOMAP_ENTRY).1 < IOMAP_ENTRY || self.inflight.len() >= self.sq_depth {
            return Err(Error::new(Errno::EAGAIN, "the send queue is full"));
        }
        let at = peer.ring_addr + u64::from(peer.ring_len) + (slot * IOMAP_ENTRY) as u64;
        if !self.post_staged(&entry.encode(), at, peer.rkey, None) {
            return Err(Error::new(Errno(libc::ECONNRESET), "the connection broke"));
        }
        Ok(())
    }

    /// Ends the mapping of the memory at `addr` (`len` bytes): the MR, for the caller to
    /// deregister. `EINVAL` when nothing is mapped there.
    pub(super) fn unmap(&mut self, addr: u64, len: usize) -> Result<Mr> {
        let same = |mr: &Mr| mr.addr() == addr && mr.length() == len;
        if let Some(i) = self.quiet_maps.iter().position(same) {
            return Ok(self.quiet_maps.swap_remove(i));
        }
        let slot = self
            .maps
            .iter()
            .position(|m| m.as_ref().is_some_and(|(mr, _)| same(mr)))
            .ok_or(Error::new(Errno::EINVAL, "no mapping of that memory"))?;
        let gone = IoMapEntry::default();
        // The peer forgets it only if the connection still stands; ours goes regardless.
        let _ = self.write_entry(slot, &gone);
        Ok(self.maps[slot].take().expect("found").0)
    }

    /// Writes what fits of `data` into the peer's mapping at `offset` now (a plain RDMA WRITE:
    /// the peer's application sees the bytes with no call of its own): the bytes taken.
    /// `EINVAL` when the peer mapped nothing at `offset`.
    pub(super) fn iowrite(&mut self, data: &[u8], offset: u64) -> Result<usize> {
        let entry = self.find_peer_map(offset)?;
        let room = (entry.len - (offset - entry.offset)) as usize;
        let want = data.len().min(room).min(MAX_MSG);
        if self.inflight.len() >= self.sq_depth {
            return Ok(0);
        }
        let n = self.stage(want).1;
        let at = entry.addr + (offset - entry.offset);
        if n == 0 || !self.post_staged(&data[..n], at, entry.rkey, None) {
            return Ok(0);
        }
        Ok(n)
    }

    fn find_peer_map(&self, offset: u64) -> Result<IoMapEntry> {
        for slot in 0..IOMAP_TABLE {
            let mut b = [0u8; IOMAP_ENTRY];
            self.ring.read(self.ring_len + slot * IOMAP_ENTRY, &mut b)?;
            let e = IoMapEntry::decode(&b);
            if e.covers(offset) {
                return Ok(e);
            }
        }
        Err(Error::new(Errno::EINVAL, "the peer mapped nothing at that offset"))
    }

    /// Every MR the application's mappings hold (to deregister at close).
    pub(super) fn take_maps(&mut self) -> Vec<Mr> {
        let mapped = self.maps.iter_mut().filter_map(Option::take).map(|(mr, _)| mr);
        mapped.chain(self.quiet_maps.drain(..)).collect()
    }

    /// Arms the CQ's event, so that a completion makes the channel's fd readable.
    pub(super) fn arm(&self) {
        let _ = self.cq.req_notify(false);
    }

    /// Takes the events the channel holds (each acknowledged).
    pub(super) fn drain_events(&self) {
        while let Some(cq) = self.comp.queued_cq_event() {
            cq.ack_events(1);
        }
    }

    /// Destroys the verbs objects (the QP must be out of the CM's hands first).
    pub(super) fn destroy(mut self) {
        for mr in self.take_maps() {
            let _ = mr.dereg();
        }
        let _ = self.qp.destroy();
        let _ = self.ring.dereg();
        let _ = self.sbuf.dereg();
        self.drain_events();
        let _ = self.cq.destroy();
        let _ = self.comp.destroy();
        let _ = self.pd.dealloc();
    }
}
