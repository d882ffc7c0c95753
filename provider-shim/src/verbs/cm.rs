//! librdmacm's functions over the emulator's connection manager (`rdma_emu::cm`).
//!
//! They live in this library, next to the verbs, so that one emulator serves both: each is
//! exported privately as `rdma_emu_cm__<name>` (version node `RDMA_EMU_CM_1.0`), and the drop-in
//! `librdmacm.so.1` (crate `rdmacm-shim`) is nothing but `<name>@RDMACM_1.x` trampolines that
//! jump here. librdmacm's conventions hold: 0 or -1 with `errno`, NULL with `errno`.

use core::ffi::{c_char, c_int, c_void};
use std::{net::SocketAddr, os::fd::AsRawFd, ptr, sync::OnceLock, time::Duration};

use rdma_emu::cm::{CmChannel, CmEvent, CmEventType, CmId, ConnParam, PortSpace};
use rdma_emu::sync::{Condvar, Mutex};

use super::sockaddr;
use crate::{
    abi::*,
    boundary::{ffi, set_errno},
    objects::*,
};

/// `struct rdma_event_channel` and the emulator's channel behind it.
#[repr(C)]
pub(crate) struct ShimCmChannel {
    ch: rdma_event_channel,
    emu: CmChannel,
}

/// `struct rdma_cm_id` and the emulator's id behind it.
#[repr(C)]
pub(crate) struct ShimCmId {
    id: rdma_cm_id,
    emu: CmId,
    extra: Mutex<Extra>,
    /// Signalled as an event counted for the id is acknowledged (see [`Extra::reported`]).
    acks: Condvar,
}

/// What librdmacm keeps for an id beyond `struct rdma_cm_id`.
struct Extra {
    /// The private channel of an id made without one (librdmacm's synchronous mode): each
    /// call waits there for the event it causes.
    sync: *mut rdma_event_channel,
    /// The last event a synchronous call waited for (`id->event`), acknowledged by the next
    /// one or by the destroy.
    event: *mut rdma_cm_event,
    /// `rdma_create_ep` on a listener: the QP every id from `rdma_get_request` gets.
    qp_init: Option<(ibv_qp_init_attr, *mut ibv_pd)>,
    /// `rdma_create_qp` made the id's completion channels and CQs (no CQs were given).
    own_cqs: bool,
    /// The multicast groups joined: the application's context for each, and whether the
    /// join is send-only (the QP is then not attached).
    groups: Vec<Group>,
    /// The events handed to the application for this id (a connection request counts for
    /// its listener), and how many of them it acknowledged: `rdma_destroy_id` and
    /// `rdma_migrate_id` return only once it acknowledged them all, as librdmacm's do (the
    /// kernel tells the library how many it reported; the library counts acknowledgements),
    /// so an event's `id` stays valid until its acknowledgement.
    reported: u64,
    acked: u64,
}

/// A multicast group an id joined.
struct Group {
    addr: SocketAddr,
    context: *mut c_void,
    send_only: bool,
    /// The multicast GID and LID the id's QP was attached to, once the join completed (the
    /// pair the leave detaches, as librdmacm keeps its `mgid` and `mlid`).
    attached: Option<([u8; 16], u16)>,
    /// The group's events handed out and acknowledged (they count for the id too):
    /// `rdma_leave_multicast` waits for the acknowledgements, as librdmacm's does.
    reported: u64,
    acked: u64,
}

impl Default for Extra {
    fn default() -> Extra {
        Extra {
            sync: ptr::null_mut(),
            event: ptr::null_mut(),
            qp_init: None,
            own_cqs: false,
            groups: Vec::new(),
            reported: 0,
            acked: 0,
        }
    }
}

/// `struct rdma_cm_event`, with the private data its `param` points at.
#[repr(C)]
pub(crate) struct ShimCmEvent {
    ev: rdma_cm_event,
    private_data: Vec<u8>,
    /// The id this event counts for until it is acknowledged (a connection request's
    /// listener; see [`Extra::reported`]), and the multicast group it is about, if any.
    owner: *const ShimCmId,
    group: Option<SocketAddr>,
}

/// How long an id's destroy, migration or leave waits for acknowledgements before it says so
/// on standard error (it goes on waiting: librdmacm would wait for ever, silently).
const ACK_WAIT_TOLD: Duration = Duration::from_secs(5);

/// Waits until every event `pending` counts of the id `s` has been acknowledged, as librdmacm
/// waits in `what`.
fn wait_for_acks(s: &ShimCmId, what: &str, pending: impl Fn(&Extra) -> u64) {
    let mut x = s.extra.lock();
    let mut told = false;
    while pending(&x) > 0 {
        let timed_out;
        (x, timed_out) = s.acks.wait_timeout(x, ACK_WAIT_TOLD);
        if timed_out && !told {
            eprintln!(
                "rdma-emu: {what} waits for {} event(s) of the id to be acknowledged \
                 (rdma_ack_cm_event), as librdmacm waits",
                pending(&x)
            );
            told = true;
        }
    }
}

/// Held while a thread turns an emulator event into a C one (it reaches the id through the
/// id's user data) and while `rdma_destroy_id` frees an id: a program may destroy an id on
/// one thread while another waits for events (cmtime does), and the waiting thread must never
/// touch an id already freed.
static EVENT_IDS: Mutex<()> = Mutex::new(());

/// -1 with `errno` set from `e`.
fn fail(e: rdma_emu::Error) -> c_int {
    set_errno(e.errno().raw());
    -1
}

fn fail_with(errno: c_int) -> c_int {
    set_errno(errno);
    -1
}

/// `res` as librdmacm returns it: 0, or -1 with `errno`.
fn done(res: rdma_emu::Result<()>) -> c_int {
    res.map_or_else(fail, |()| 0)
}

/// The verbs context this library gives ids on device `index` (one per device, opened on
/// first use and kept, as librdmacm keeps the contexts of `rdma_get_devices`; a child of
/// `fork` opens its own, on its own devices).
fn device_context(index: u32) -> *mut ibv_context {
    static CONTEXTS: OnceLock<Mutex<(u64, Vec<usize>)>> = OnceLock::new();
    let devs = super::device::devices();
    let Some(dev) = devs.get(index as usize) else { return ptr::null_mut() };
    let mut guard = CONTEXTS.get_or_init(Default::default).lock();
    let (generation, all) = &mut *guard;
    if *generation != rdma_emu::fork_generation() {
        // The parent's contexts, which its child may not use.
        (*generation, *all) = (rdma_emu::fork_generation(), Vec::new());
    }
    if all.len() < devs.len() {
        all.resize(devs.len(), 0);
    }
    if all[index as usize] == 0 {
        let d = &dev.dev as *const ibv_device as *mut ibv_device;
        // SAFETY: one of our devices.
        all[index as usize] = unsafe { super::device::rdma_emu_shim__ibv_open_device(d) } as usize;
    }
    all[index as usize] as *mut ibv_context
}

/// The address a `struct sockaddr` holds (IPv4 or IPv6), if any.
///
/// # Safety
/// `p` is NULL or points at a socket address of the length its family implies.
unsafe fn socket_addr(p: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: by the caller's contract.
    unsafe { sockaddr::from_c(p, None) }.ok()
}

/// Writes `a` into a `struct sockaddr_storage` (all zeros for none).
fn write_addr(dst: &mut [u64; 16], a: Option<SocketAddr>) {
    *dst = [0; 16];
    let Some(a) = a else { return };
    let (storage, _) = sockaddr::to_c(a);
    const _: () = assert!(size_of::<libc::sockaddr_storage>() == size_of::<[u64; 16]>());
    // SAFETY: both are 128 bytes and do not overlap.
    unsafe {
        ptr::copy_nonoverlapping(ptr::from_ref(&storage).cast::<u8>(), dst.as_mut_ptr().cast(), 128)
    };
}

/// Brings the C struct of `s` up to date with its emulator id.
fn refresh(s: *mut ShimCmId) {
    // SAFETY: a live id of ours; C reads these fields between calls, as with librdmacm.
    let s = unsafe { &mut *s };
    let emu = &s.emu;
    if let Some(ctx) = emu.context() {
        s.id.verbs = device_context(ctx.device().index());
        // As librdmacm gives an id its device's PD with the device (`ucma_get_device`), for
        // a QP the program makes itself (`ibv_create_qp(id->pd, ...)`).
        if s.id.pd.is_null() && !s.id.verbs.is_null() {
            s.id.pd = default_pd(s.id.verbs);
        }
    }
    s.id.port_num = emu.port_num();
    write_addr(&mut s.id.route.addr.src_storage, emu.local_addr());
    write_addr(&mut s.id.route.addr.dst_storage, emu.peer_addr());
    // The route's path, once there is one, as librdmacm reads it from the kernel (kept
    // until the id is destroyed).
    if s.id.route.num_paths == 0
        && let Some(p) = emu.path()
    {
        let rec = ibv_sa_path_rec {
            dgid: ibv_gid { raw: p.dgid.0 },
            sgid: ibv_gid { raw: p.sgid.0 },
            dlid: p.dlid.to_be(),
            slid: p.slid.to_be(),
            raw_traffic: 0,
            flow_label: p.flow_label.to_be(),
            hop_limit: p.hop_limit,
            traffic_class: p.traffic_class,
            reversible: 1,
            numb_path: 1,
            pkey: p.pkey.to_be(),
            sl: p.sl,
            // IB_SA_EQ: exactly these.
            mtu_selector: 2,
            mtu: p.mtu.0 as u8,
            rate_selector: 2,
            rate: p.rate,
            packet_life_time_selector: 2,
            packet_life_time: p.packet_life_time,
            preference: 0,
        };
        s.id.route.path_rec = Box::into_raw(Box::new(rec)).cast();
        s.id.route.num_paths = 1;
        s.id.route.addr.addr = rdma_ib_addr {
            sgid: ibv_gid { raw: p.sgid.0 },
            dgid: ibv_gid { raw: p.dgid.0 },
            pkey: p.pkey.to_be(),
        };
    }
}

/// Frees the path record [`refresh`] gave the id `s`, if any.
fn free_path(s: *mut ShimCmId) {
    // SAFETY: a live id of ours, whose fields C no longer reads (it is being destroyed).
    let s = unsafe { &mut *s };
    let p = std::mem::replace(&mut s.id.route.path_rec, ptr::null_mut());
    s.id.route.num_paths = 0;
    if !p.is_null() {
        // SAFETY: made by `refresh` with `Box::into_raw`, and handed out to nobody else.
        drop(unsafe { Box::from_raw(p.cast::<ibv_sa_path_rec>()) });
    }
}

/// Brings `id->qp->state` up to date after the CM moved the QP, where librdmacm's own
/// ibv_modify_qp calls would have: only in calls about the connection (never for an event
/// like DISCONNECTED, which may race with the program's ibv_destroy_qp on another thread).
fn refresh_qp_state(p: *mut ShimCmId) {
    // SAFETY: a live id of ours.
    let s = unsafe { &*p };
    // SAFETY: checked against the registry: the program may have destroyed the QP with
    // ibv_destroy_qp and left `id->qp` dangling.
    if let (Some(qp), Some(c)) = (s.emu.qp(), unsafe { obj::<_, ShimQp>(s.id.qp) })
        && c.emu.qp_num() == qp.qp_num()
    {
        // SAFETY: a live QP of ours (as the registry says).
        unsafe { (*s.id.qp).state = qp.state().0 };
    }
}

/// Makes the emulator's id connect the QP `id->qp` names now, as librdmacm reads that field at
/// each call: a program may have moved a QP there from another id (DAPL does), or cleared it.
/// A pointer that names no QP of ours leaves the id as it was.
fn adopt_qp(s: &ShimCmId) {
    if s.id.qp.is_null() {
        s.emu.use_qp(None);
        return;
    }
    // SAFETY: checked against the registry (a destroyed QP may have left `id->qp` dangling).
    let Some(c) = (unsafe { obj::<_, ShimQp>(s.id.qp) }) else { return };
    s.emu.use_qp(Some(&c.emu));
}

/// A new C id over `emu`, on `channel` with the application's `context`.
fn new_id(emu: CmId, channel: *mut rdma_event_channel, context: *mut c_void) -> *mut ShimCmId {
    // SAFETY: all-zero is a valid rdma_cm_id (NULL pointers, zero numbers).
    let mut id: rdma_cm_id = unsafe { std::mem::zeroed() };
    (id.channel, id.context, id.ps) = (channel, context, emu.port_space().code());
    id.qp_type = if emu.port_space() == PortSpace::Udp { 4 } else { 2 }; // IBV_QPT_UD : RC
    let p = leak_unowned(ShimCmId { id, emu, extra: Mutex::default(), acks: Condvar::new() });
    // SAFETY: just made.
    unsafe { (*p).emu.set_user_data(p as usize) };
    refresh(p);
    p
}

/// The id behind a C pointer, if it is a live one of ours.
fn cm_id<'a>(p: *mut rdma_cm_id) -> Option<&'a ShimCmId> {
    // SAFETY: checked against the registry.
    unsafe { obj::<_, ShimCmId>(p) }
}

/// `rdma_create_event_channel()`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_create_event_channel()
-> *mut rdma_event_channel {
    ffi!(ptr::null_mut(), {
        let Some(fabric) = super::device::fabric() else {
            set_errno(libc::ENODEV);
            return ptr::null_mut();
        };
        match CmChannel::new(&fabric) {
            Ok(emu) => {
                let ch = rdma_event_channel { fd: emu.as_raw_fd() };
                leak_unowned(ShimCmChannel { ch, emu }).cast()
            }
            Err(e) => {
                set_errno(e.errno().raw());
                ptr::null_mut()
            }
        }
    })
}

/// `rdma_destroy_event_channel(channel)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_destroy_event_channel(
    ch: *mut rdma_event_channel,
) {
    ffi!((), {
        // SAFETY: NULL or a channel of ours, not used after this call.
        if let Some(s) = unsafe { obj::<_, ShimCmChannel>(ch) } {
            // SAFETY: as above.
            unsafe { free(s as *const ShimCmChannel) };
        }
    })
}

/// An id on `ch`, or for a NULL `ch` on a private channel of its own (synchronous mode).
fn create_id(
    ch: *mut rdma_event_channel,
    context: *mut c_void,
    ps: PortSpace,
) -> Result<*mut ShimCmId, c_int> {
    let sync = ch.is_null();
    let ch = if sync {
        // SAFETY: makes a channel of ours.
        let c = unsafe { rdma_emu_shim__rdma_emu_cm__rdma_create_event_channel() };
        if c.is_null() {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOMEM));
        }
        c
    } else {
        ch
    };
    // SAFETY: a channel of ours, checked against the registry.
    let Some(c) = (unsafe { obj::<_, ShimCmChannel>(ch) }) else { return Err(libc::EINVAL) };
    match CmId::create(&c.emu, ps) {
        Ok(emu) => {
            let p = new_id(emu, ch, context);
            if sync {
                // SAFETY: just made.
                unsafe { (*p).extra.lock().sync = ch };
            }
            Ok(p)
        }
        Err(e) => {
            if sync {
                // SAFETY: the private channel just made, not handed out.
                unsafe { rdma_emu_shim__rdma_emu_cm__rdma_destroy_event_channel(ch) };
            }
            Err(e.errno().raw())
        }
    }
}

/// For an id in synchronous mode: waits for the event the call just caused and keeps it as
/// `id->event` (acknowledging the one before); 0, or -1 with the event's error as `errno`
/// (`ECONNREFUSED` for a rejection). Nothing to wait for otherwise.
fn complete(s: &ShimCmId) -> c_int {
    let (sync, old) = {
        let mut x = s.extra.lock();
        (x.sync, std::mem::replace(&mut x.event, ptr::null_mut()))
    };
    if sync.is_null() {
        return 0;
    }
    if !old.is_null() {
        // SAFETY: an event of ours that only this id held.
        unsafe { rdma_emu_shim__rdma_emu_cm__rdma_ack_cm_event(old) };
    }
    let mut ev: *mut rdma_cm_event = ptr::null_mut();
    // SAFETY: the id's private channel; `ev` is writable.
    if unsafe { rdma_emu_shim__rdma_emu_cm__rdma_get_cm_event(sync, &mut ev) } != 0 {
        return -1;
    }
    s.extra.lock().event = ev;
    let id = s as *const ShimCmId as *mut ShimCmId;
    // SAFETY: a live id of ours; the event just received.
    let (event, status) = unsafe {
        (*id).id.event = ev;
        ((*ev).event, (*ev).status)
    };
    match status {
        0 => 0,
        _ if event == CmEventType::Rejected.code() => fail_with(libc::ECONNREFUSED),
        s if s < 0 => fail_with(-s),
        s => fail_with(s),
    }
}

/// `rdma_create_id(channel, id, context, ps)`; a NULL channel gives the id one of its own, on
/// which each call waits for its outcome (librdmacm's synchronous mode).
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_create_id(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        if out.is_null() {
            return fail_with(libc::EINVAL);
        }
        let Some(ps) = PortSpace::from_code(ps) else { return fail_with(libc::EINVAL) };
        match create_id(ch, context, ps) {
            Ok(p) => {
                // SAFETY: `out` is writable (checked non-NULL; the application's pointer).
                unsafe { *out = p.cast() };
                0
            }
            Err(e) => fail_with(e),
        }
    })
}

/// `rdma_destroy_id(id)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_destroy_id(
    id: *mut rdma_cm_id,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        let res = s.emu.destroy();
        {
            // From here no event is made for the id (`shim_event` finds it through this).
            let _ids = EVENT_IDS.lock();
            s.emu.set_user_data(0);
        }
        let (sync, event) = {
            let mut x = s.extra.lock();
            (x.sync, std::mem::replace(&mut x.event, ptr::null_mut()))
        };
        if !event.is_null() {
            // SAFETY: the id's own event, which nobody else holds.
            unsafe { rdma_emu_shim__rdma_emu_cm__rdma_ack_cm_event(event) };
        }
        // Another thread may still be reading an event about the id.
        wait_for_acks(s, "rdma_destroy_id", |x| x.reported - x.acked);
        if !sync.is_null() {
            // SAFETY: the id's own channel, which nobody else holds.
            unsafe { rdma_emu_shim__rdma_emu_cm__rdma_destroy_event_channel(sync) };
        }
        free_path(id.cast());
        // SAFETY: not used by C after rdma_destroy_id (the contract), nor by any event of it
        // (all acknowledged).
        unsafe { free(s as *const ShimCmId) };
        done(res)
    })
}

/// `rdma_bind_addr(id, addr)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_bind_addr(
    id: *mut rdma_cm_id,
    addr: *const libc::sockaddr,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        // SAFETY: the application's socket address.
        let Some(a) = (unsafe { socket_addr(addr) }) else { return fail_with(libc::EINVAL) };
        let res = s.emu.bind_addr(a);
        refresh(id.cast());
        done(res)
    })
}

/// `rdma_resolve_addr(id, src_addr, dst_addr, timeout_ms)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *const libc::sockaddr,
    dst: *const libc::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        // SAFETY: the application's socket addresses (src may be NULL).
        let (src, dst) = unsafe { (socket_addr(src), socket_addr(dst)) };
        let Some(dst) = dst else { return fail_with(libc::EINVAL) };
        let res = s.emu.resolve_addr(src, dst, timeout_ms.max(0) as u32);
        refresh(id.cast());
        if done(res) != 0 {
            return -1;
        }
        complete(s)
    })
}

/// `rdma_resolve_route(id, timeout_ms)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_resolve_route(
    id: *mut rdma_cm_id,
    timeout_ms: c_int,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        if done(s.emu.resolve_route(timeout_ms.max(0) as u32)) != 0 {
            return -1;
        }
        complete(s)
    })
}

/// `rdma_listen(id, backlog)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_listen(
    id: *mut rdma_cm_id,
    backlog: c_int,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        let res = s.emu.listen(backlog);
        // An id listened on unbound was bound by it: its address is news to C.
        refresh(id.cast());
        done(res)
    })
}

/// The connection parameters C passed (NULL: librdmacm's defaults).
///
/// # Safety
/// `p` is NULL or a valid `rdma_conn_param` whose private data is readable.
unsafe fn conn_param(p: *const rdma_conn_param) -> ConnParam {
    // SAFETY: by the caller's contract.
    let Some(p) = (unsafe { p.as_ref() }) else {
        return ConnParam {
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            ..Default::default()
        };
    };
    let private_data = if p.private_data.is_null() || p.private_data_len == 0 {
        Vec::new()
    } else {
        // SAFETY: private_data_len readable bytes, as the application promises.
        unsafe {
            std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len.into())
        }
        .to_vec()
    };
    ConnParam {
        private_data,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: p.srq != 0,
        qp_num: p.qp_num,
    }
}

/// `rdma_connect(id, conn_param)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_connect(
    id: *mut rdma_cm_id,
    param: *const rdma_conn_param,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        adopt_qp(s);
        // SAFETY: the application's parameters.
        if done(s.emu.connect(&unsafe { conn_param(param) })) != 0 {
            return -1;
        }
        let r = complete(s);
        refresh(id.cast());
        refresh_qp_state(id.cast());
        r
    })
}

/// `rdma_accept(id, conn_param)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_accept(
    id: *mut rdma_cm_id,
    param: *const rdma_conn_param,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        adopt_qp(s);
        // SAFETY: the application's parameters.
        let res = s.emu.accept(&unsafe { conn_param(param) });
        refresh(id.cast());
        if done(res) != 0 {
            return -1;
        }
        let r = complete(s);
        refresh(id.cast());
        refresh_qp_state(id.cast());
        r
    })
}

/// `rdma_reject(id, private_data, private_data_len)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_reject(
    id: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        // SAFETY: `len` readable bytes at `data` (or NULL), as the application promises.
        let private = unsafe { private_bytes(data, len) };
        done(s.emu.reject(private))
    })
}

/// `rdma_disconnect(id)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_disconnect(
    id: *mut rdma_cm_id,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        adopt_qp(s);
        let res = s.emu.disconnect();
        refresh(id.cast());
        refresh_qp_state(id.cast());
        if let Err(e) = res {
            return fail(e);
        }
        // A synchronous id waits for its `DISCONNECTED` (the other side's answer), as
        // librdmacm's does.
        complete(s)
    })
}

/// `rdma_establish(id)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_establish(
    id: *mut rdma_cm_id,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        adopt_qp(s);
        done(s.emu.establish())
    })
}

/// `rdma_get_cm_event(channel, event)`: the next event, blocking unless the channel's fd is
/// non-blocking (then `EAGAIN`). A connection request brings a new id with it, on the
/// listener's channel and with its context.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_event,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        // SAFETY: a channel of ours, checked against the registry.
        let Some(c) = (unsafe { obj::<_, ShimCmChannel>(ch) }) else {
            return fail_with(libc::EINVAL);
        };
        if out.is_null() {
            return fail_with(libc::EINVAL);
        }
        // Our own handle: the application may destroy the channel while this thread waits
        // (rping does, from its main thread); the wait then goes on, as on a closed kernel
        // file, instead of touching what was freed.
        let emu = c.emu.clone();
        loop {
            let ev = match emu.get_event() {
                Ok(ev) => ev,
                Err(e) => return fail(e),
            };
            if let Some(p) = shim_event(ch, ev) {
                // SAFETY: `out` is writable (checked non-NULL).
                unsafe { *out = p.cast() };
                return 0;
            }
        }
    })
}

/// The C event for `ev`; `None` for an event about an id the application destroyed.
fn shim_event(ch: *mut rdma_event_channel, ev: CmEvent) -> Option<*mut ShimCmEvent> {
    let _ids = EVENT_IDS.lock();
    let listen = ev.listen_id.as_ref().map_or(ptr::null_mut(), |l| l.user_data() as *mut ShimCmId);
    let (id, owner) = if ev.event == CmEventType::ConnectRequest {
        // SAFETY: NULL or a live id of ours (its user data is cleared at destroy).
        let Some(l) = (unsafe { listen.as_ref() }) else {
            // Its listener was destroyed after the event was taken off the channel: the request
            // goes with it, as the kernel's destroy takes a listener's requests.
            let _ = ev.id.destroy();
            return None;
        };
        let id = new_id(ev.id.clone(), ch, l.id.context);
        // The new id is of the listener's QP type, as librdmacm makes it.
        // SAFETY: just made, ours.
        unsafe { (*id).id.qp_type = l.id.qp_type };
        (id, listen)
    } else {
        let id = ev.id.user_data() as *mut ShimCmId;
        (id, id)
    };
    if id.is_null() {
        return None;
    }
    {
        // SAFETY: a live id of ours (we hold EVENT_IDS, which its destroy takes to retire it).
        let mut x = unsafe { &*owner }.extra.lock();
        x.reported += 1;
        if let Some(g) = ev.group.and_then(|a| x.groups.iter_mut().find(|g| g.addr == a)) {
            g.reported += 1;
        }
    }
    refresh(id);
    if matches!(ev.event, CmEventType::Established | CmEventType::Rejected) {
        // librdmacm moves an active side's QP to RTS while it takes this event in (to the
        // error state for a rejection).
        refresh_qp_state(id);
    }
    // SAFETY: all-zero is a valid rdma_cm_event.
    let mut c: rdma_cm_event = unsafe { std::mem::zeroed() };
    (c.id, c.listen_id) = (id.cast(), listen.cast());
    (c.event, c.status) = (ev.event.code(), ev.status);
    let p = &ev.param;
    let private_data = p.private_data.clone();
    let mut s = Box::new(ShimCmEvent { ev: c, private_data, owner, group: ev.group });
    // The conn member of the param union over the ud member's storage.
    let conn = rdma_conn_param {
        private_data: if s.private_data.is_empty() {
            ptr::null()
        } else {
            s.private_data.as_ptr().cast()
        },
        private_data_len: s.private_data.len().min(255) as u8,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: u8::from(p.srq),
        qp_num: p.qp_num,
    };
    if let Some(ud) = &ev.ud {
        // A UD peer, or a multicast group (whose private data is the join's context): `param.ud`.
        let context = ev.group.map(|g| joined(id, g, ud));
        s.ev.param = rdma_ud_param {
            private_data: context.unwrap_or(conn.private_data),
            private_data_len: conn.private_data_len,
            ah_attr: super::qp::ah_to_c(&ud.ah_attr),
            qp_num: ud.qp_num,
            qkey: ud.qkey,
        };
    } else {
        // SAFETY: `param` is a union whose storage (rdma_ud_param, 56 bytes, 8-aligned) holds
        // an rdma_conn_param (24 bytes) at its start.
        unsafe { ptr::addr_of_mut!(s.ev.param).cast::<rdma_conn_param>().write(conn) };
    }
    let p = Box::into_raw(s);
    register(p);
    Some(p)
}

/// A multicast join completed for `group`: the id's QP is attached to the group's GID (unless
/// the join is send-only), as librdmacm does; the join's context.
fn joined(id: *mut ShimCmId, group: SocketAddr, ud: &rdma_emu::cm::UdParam) -> *const c_void {
    // SAFETY: a live id of ours (the caller holds EVENT_IDS).
    let s = unsafe { &*id };
    let mut extra = s.extra.lock();
    let Some(g) = extra.groups.iter_mut().find(|g| g.addr == group && g.attached.is_none()) else {
        return ptr::null();
    };
    let gid = ud.ah_attr.dgid.0;
    // SAFETY: NULL or the id's QP.
    if let Some(qp) = unsafe { obj::<_, ShimQp>(s.id.qp) }.filter(|_| !g.send_only)
        && qp.emu.attach_mcast(&rdma_emu::Gid(gid), ud.ah_attr.dlid).is_ok()
    {
        g.attached = Some((gid, ud.ah_attr.dlid));
    }
    g.context
}

/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS` / `RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS`.
const JOIN_ADDRESS: u32 = 1;
const JOIN_FLAGS: u32 = 2;
/// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`.
const SENDONLY_FULLMEMBER: u32 = 1;

/// `rdma_join_multicast(id, addr, context)`: a full-member join.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    let mut attr =
        rdma_cm_join_mc_attr_ex { comp_mask: JOIN_ADDRESS | JOIN_FLAGS, join_flags: 0, addr };
    // SAFETY: forwarded; `attr` is ours.
    unsafe { rdma_emu_shim__rdma_emu_cm__rdma_join_multicast_ex(id, &mut attr, context) }
}

/// `rdma_join_multicast_ex(id, mc_join_attr, context)`: joins the group at `addr`, as a full
/// member or send-only; `RDMA_CM_EVENT_MULTICAST_JOIN` follows, its `param.ud` the address of
/// the group and its private data `context`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        // SAFETY: NULL or the application's attributes.
        let Some(a) = (unsafe { attr.as_ref() }) else { return fail_with(libc::EINVAL) };
        if a.comp_mask & !(JOIN_ADDRESS | JOIN_FLAGS) != 0 {
            return fail_with(libc::ENOTSUP);
        }
        let full = JOIN_ADDRESS | JOIN_FLAGS;
        if a.comp_mask & full != full || a.join_flags > SENDONLY_FULLMEMBER {
            return fail_with(libc::EINVAL);
        }
        // SAFETY: NULL or the application's address.
        let Some(group) = (unsafe { socket_addr(a.addr) }) else { return fail_with(libc::EINVAL) };
        let send_only = a.join_flags == SENDONLY_FULLMEMBER;
        let g = Group { addr: group, context, send_only, attached: None, reported: 0, acked: 0 };
        s.extra.lock().groups.push(g);
        match s.emu.join_multicast(group) {
            Ok(()) => 0,
            Err(e) => {
                let mut extra = s.extra.lock();
                if let Some(i) = extra.groups.iter().rposition(|g| g.addr == group) {
                    extra.groups.remove(i);
                }
                fail(e)
            }
        }
    })
}

/// `rdma_leave_multicast(id, addr)`: leaves the group (its QP detached first);
/// `EADDRNOTAVAIL` for a group the id did not join.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        // SAFETY: NULL or the application's address.
        let Some(group) = (unsafe { socket_addr(addr) }) else { return fail_with(libc::EINVAL) };
        if let Err(e) = s.emu.leave_multicast(group) {
            return fail(e);
        }
        let unacked = |x: &Extra| {
            let g = x.groups.iter().find(|g| g.addr == group);
            g.map_or(0, |g| g.reported - g.acked)
        };
        wait_for_acks(s, "rdma_leave_multicast", unacked);
        let mut extra = s.extra.lock();
        if let Some(i) = extra.groups.iter().position(|g| g.addr == group) {
            let g = extra.groups.remove(i);
            // SAFETY: NULL or the id's QP.
            if let (Some((gid, lid)), Some(qp)) = (g.attached, unsafe { obj::<_, ShimQp>(s.id.qp) })
            {
                let _ = qp.emu.detach_mcast(&rdma_emu::Gid(gid), lid);
            }
        }
        0
    })
}

/// `rdma_ack_cm_event(event)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_ack_cm_event(
    ev: *mut rdma_cm_event,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        // SAFETY: NULL or an event of ours, not used after its acknowledgement.
        let Some(s) = (unsafe { obj::<_, ShimCmEvent>(ev) }) else {
            return fail_with(libc::EINVAL);
        };
        // SAFETY: the id the event counts for waits for this acknowledgement before it is
        // freed (`wait_for_acks`).
        let owner = unsafe { &*s.owner };
        {
            let mut x = owner.extra.lock();
            x.acked += 1;
            if let Some(g) = s.group.and_then(|a| x.groups.iter_mut().find(|g| g.addr == a)) {
                g.acked += 1;
            }
        }
        owner.acks.notify_all();
        // SAFETY: as above.
        unsafe { free(s as *const ShimCmEvent) };
        0
    })
}

/// `rdma_event_str(event)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_event_str(
    event: u32,
) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 16] = [
        c"RDMA_CM_EVENT_ADDR_RESOLVED",
        c"RDMA_CM_EVENT_ADDR_ERROR",
        c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        c"RDMA_CM_EVENT_ROUTE_ERROR",
        c"RDMA_CM_EVENT_CONNECT_REQUEST",
        c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        c"RDMA_CM_EVENT_CONNECT_ERROR",
        c"RDMA_CM_EVENT_UNREACHABLE",
        c"RDMA_CM_EVENT_REJECTED",
        c"RDMA_CM_EVENT_ESTABLISHED",
        c"RDMA_CM_EVENT_DISCONNECTED",
        c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        c"RDMA_CM_EVENT_MULTICAST_JOIN",
        c"RDMA_CM_EVENT_MULTICAST_ERROR",
        c"RDMA_CM_EVENT_ADDR_CHANGE",
        c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
    ];
    NAMES.get(event as usize).copied().unwrap_or(c"UNKNOWN EVENT").as_ptr()
}

/// The PD `rdma_create_qp` uses when given none: one per device, as librdmacm keeps.
fn default_pd(verbs: *mut ibv_context) -> *mut ibv_pd {
    static PDS: OnceLock<Mutex<Vec<(usize, usize)>>> = OnceLock::new();
    let mut pds = PDS.get_or_init(Default::default).lock();
    if let Some(&(_, pd)) = pds.iter().find(|(c, _)| *c == verbs as usize) {
        return pd as *mut ibv_pd;
    }
    // SAFETY: a context of ours.
    let pd = unsafe { super::pd_mr::rdma_emu_shim__ibv_alloc_pd(verbs) };
    if !pd.is_null() {
        pds.push((verbs as usize, pd as usize));
    }
    pd
}

/// The XRC domain this library opens on `verbs` for the XRC SRQs of its ids (one per device,
/// kept, as librdmacm keeps its `cma_device`'s).
fn device_xrcd(verbs: *mut ibv_context) -> *mut ibv_xrcd {
    static XRCDS: OnceLock<Mutex<Vec<(usize, usize)>>> = OnceLock::new();
    let mut all = XRCDS.get_or_init(Default::default).lock();
    if let Some(&(_, x)) = all.iter().find(|(c, _)| *c == verbs as usize) {
        return x as *mut ibv_xrcd;
    }
    let mut attr = ibv_xrcd_init_attr {
        comp_mask: super::xrc::IBV_XRCD_INIT_ATTR_FD | super::xrc::IBV_XRCD_INIT_ATTR_OFLAGS,
        fd: -1,
        oflags: libc::O_CREAT,
    };
    // SAFETY: a context of ours and the attributes above.
    let x = unsafe { super::xrc::open_xrcd(verbs, &mut attr) };
    if !x.is_null() {
        all.push((verbs as usize, x as usize));
    }
    x
}

/// A completion channel and a CQ of `cqe` entries on it, for an id.
///
/// # Safety
/// `verbs` is a context of ours.
unsafe fn channel_and_cq(
    verbs: *mut ibv_context,
    cqe: u32,
    id: *mut c_void,
) -> Option<(*mut ibv_comp_channel, *mut ibv_cq)> {
    // SAFETY: forwarded.
    let ch = unsafe { super::cq::rdma_emu_shim__ibv_create_comp_channel(verbs) };
    if ch.is_null() {
        return None;
    }
    let cqe = cqe.clamp(1, i32::MAX as u32) as c_int;
    // SAFETY: forwarded; `ch` was just made.
    let cq = unsafe { super::cq::rdma_emu_shim__ibv_create_cq(verbs, cqe, id, ch, 0) };
    if cq.is_null() {
        // SAFETY: the channel just made.
        unsafe { super::cq::rdma_emu_shim__ibv_destroy_comp_channel(ch) };
        return None;
    }
    Some((ch, cq))
}

/// `rdma_create_qp(id, pd, qp_init_attr)`: a QP on `pd` (the device's default PD if NULL)
/// that the id connects; it is in INIT until the connection takes it to RTS. Given no CQs,
/// the id gets a completion channel and a CQ for each direction (`id->send_cq_channel`, ...),
/// as librdmacm makes them for `rdma_get_send_comp` and friends. As in librdmacm, it is
/// `rdma_create_qp_ex` with the PD in the extended attributes.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        // SAFETY: NULL or the application's attributes.
        let Some(a) = (unsafe { attr.as_mut() }) else { return fail_with(libc::EINVAL) };
        // SAFETY: all-zero is valid for these plain C fields.
        let mut ax: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        (ax.qp_context, ax.send_cq, ax.recv_cq, ax.srq) =
            (a.qp_context, a.send_cq, a.recv_cq, a.srq);
        // SAFETY: plain C data, copied.
        ax.cap = unsafe { ptr::read(&a.cap) };
        (ax.qp_type, ax.sq_sig_all) = (a.qp_type, a.sq_sig_all);
        (ax.comp_mask, ax.pd) = (IBV_QP_INIT_ATTR_PD, pd);
        let r = create_qp(id, &mut ax);
        if r == 0 {
            a.cap = ax.cap;
        }
        r
    })
}

/// `rdma_create_qp_ex(id, qp_init_attr_ex)`: as `rdma_create_qp`, with the extended
/// attributes `ibv_create_qp_ex` takes (no PD in them: the device's default).
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        // SAFETY: NULL or the application's attributes.
        let Some(a) = (unsafe { attr.as_mut() }) else { return fail_with(libc::EINVAL) };
        create_qp(id, a)
    })
}

/// `IBV_QP_INIT_ATTR_PD`: the PD field of `ibv_qp_init_attr_ex` is set.
const IBV_QP_INIT_ATTR_PD: u32 = 1;
/// `IBV_QP_INIT_ATTR_XRCD`: the XRC domain field is set.
const IBV_QP_INIT_ATTR_XRCD: u32 = 2;

/// The QP of `rdma_create_qp_ex`: on the id's device, its PD the given one or the device's
/// default, its missing CQs the id's own; the id then connects it.
fn create_qp(id: *mut rdma_cm_id, a: &mut ibv_qp_init_attr_ex) -> c_int {
    let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
    if s.id.verbs.is_null() || !s.id.qp.is_null() {
        return fail_with(libc::EINVAL);
    }
    // (A QP the program took out of the id is not the id's any more.)
    adopt_qp(s);
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.comp_mask |= IBV_QP_INIT_ATTR_PD;
        a.pd = default_pd(s.id.verbs);
        if a.pd.is_null() {
            return -1;
        }
    // SAFETY: checked against the registry (a destroyed or foreign PD is refused there).
    } else if unsafe { obj::<_, ShimPd>(a.pd) }.is_none_or(|p| p.pd.context != s.id.verbs) {
        return fail_with(libc::EINVAL);
    }
    const XRCD: u32 = IBV_QP_INIT_ATTR_XRCD;
    if s.id.qp_type == IBV_QPT_XRC_RECV as u32 && (a.comp_mask & XRCD == 0 || a.xrcd.is_null()) {
        // An XRC receive QP goes into this library's XRC domain of the device.
        a.xrcd = device_xrcd(s.id.verbs);
        if a.xrcd.is_null() {
            return -1;
        }
        a.comp_mask |= XRCD;
    }
    let c = id.cast::<ShimCmId>();
    if a.srq.is_null() {
        // The SRQ rdma_create_srq gave the id.
        a.srq = s.id.srq.cast();
    }
    // A direction given no CQ takes the id's, or gets one on a channel of its own.
    if a.recv_cq.is_null() {
        a.recv_cq = s.id.recv_cq;
    }
    if a.send_cq.is_null() {
        a.send_cq = s.id.send_cq;
    }
    let (need_send, need_recv) = (a.send_cq.is_null(), a.recv_cq.is_null());
    let own = need_send || need_recv;
    for (need, size, cq, ch) in [
        // SAFETY: fields of a live id of ours.
        (need_send, a.cap.max_send_wr, &mut a.send_cq, unsafe { &mut (*c).id.send_cq_channel }),
        // SAFETY: as above.
        (need_recv, a.cap.max_recv_wr, &mut a.recv_cq, unsafe { &mut (*c).id.recv_cq_channel }),
    ] {
        if !need {
            continue;
        }
        // SAFETY: the id's device context.
        let Some((made_ch, made_cq)) = (unsafe { channel_and_cq(s.id.verbs, size, id.cast()) })
        else {
            // SAFETY: what was made here (the other direction's), not handed out.
            unsafe { destroy_own_cqs(c) };
            return fail_with(libc::ENOMEM);
        };
        (*cq, *ch) = (made_cq, made_ch);
    }
    if need_send {
        // SAFETY: a live id of ours.
        unsafe { (*c).id.send_cq = a.send_cq };
    }
    if need_recv {
        // SAFETY: as above.
        unsafe { (*c).id.recv_cq = a.recv_cq };
    }
    // SAFETY: the id's context and the attributes above, checked inside.
    let qp = unsafe { super::qp::create_qp_ex(s.id.verbs, a) };
    // SAFETY: NULL or the QP just made.
    let made = unsafe { obj::<_, ShimQp>(qp) }.map(|q| s.emu.set_qp(&q.emu));
    if made.is_none_or(|r| r.is_err()) {
        let errno = match made {
            Some(Err(e)) => e.errno().raw(),
            _ => std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL),
        };
        // SAFETY: what was made here, not handed out.
        unsafe {
            if !qp.is_null() {
                super::qp::rdma_emu_shim__ibv_destroy_qp(qp);
            }
            if own {
                destroy_own_cqs(c);
            }
        }
        return fail_with(errno);
    }
    // SAFETY: a live id of ours.
    unsafe {
        (*c).id.qp = qp;
        (*c).id.pd = a.pd;
        (*c).id.qp_type = a.qp_type;
    }
    s.extra.lock().own_cqs |= own;
    refresh(c);
    refresh_qp_state(c);
    0
}

/// Destroys the CQs the id made (those with a channel of the id's) and their channels.
///
/// # Safety
/// `c` is a live id of ours; nothing uses those CQs any more.
unsafe fn destroy_own_cqs(c: *mut ShimCmId) {
    // SAFETY: by the caller's contract.
    let i = unsafe { &mut (*c).id };
    for (ch, cq) in
        [(&mut i.send_cq_channel, &mut i.send_cq), (&mut i.recv_cq_channel, &mut i.recv_cq)]
    {
        if ch.is_null() {
            continue;
        }
        let (ch, cq) = (std::mem::take(ch), std::mem::take(cq));
        // SAFETY: ours, made for the id.
        unsafe {
            if !cq.is_null() {
                super::cq::rdma_emu_shim__ibv_destroy_cq(cq);
            }
            super::cq::rdma_emu_shim__ibv_destroy_comp_channel(ch);
        }
    }
}

/// `rdma_destroy_qp(id)`: and the CQs `rdma_create_qp` made for it.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_destroy_qp(id: *mut rdma_cm_id) {
    ffi!((), {
        let Some(s) = cm_id(id) else { return };
        let own = std::mem::take(&mut s.extra.lock().own_cqs);
        let c = id.cast::<ShimCmId>();
        // SAFETY: a live id of ours; its QP and CQs are ours or NULL.
        unsafe {
            let qp = std::mem::replace(&mut (*c).id.qp, ptr::null_mut());
            if !qp.is_null() {
                super::qp::rdma_emu_shim__ibv_destroy_qp(qp);
            }
            if own {
                destroy_own_cqs(c);
            }
        }
    })
}

/// `rdma_create_srq(id, pd, srq_init_attr)`: `rdma_create_srq_ex` with the type the id's QP
/// type implies (XRC for `IBV_QPT_XRC_RECV`, else basic) and `pd`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        // SAFETY: NULL or the application's attributes.
        let Some(a) = (unsafe { attr.as_mut() }) else { return fail_with(libc::EINVAL) };
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        // SAFETY: all-zero is valid for these plain C fields.
        let mut ax: ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        use super::xrc::{
            IBV_SRQ_INIT_ATTR_PD, IBV_SRQ_INIT_ATTR_TYPE, IBV_SRQT_BASIC, IBV_SRQT_XRC,
        };
        ax.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
        (ax.srq_context, ax.pd) = (a.srq_context, pd);
        // SAFETY: plain C data, copied.
        ax.attr = unsafe { ptr::read(&a.attr) };
        ax.srq_type =
            if s.id.qp_type == IBV_QPT_XRC_RECV as u32 { IBV_SRQT_XRC } else { IBV_SRQT_BASIC };
        let r = create_srq(id, &mut ax);
        a.attr = ax.attr;
        r
    })
}

/// `rdma_create_srq_ex(id, srq_init_attr_ex)`: an SRQ on the id's device that the QP
/// `rdma_create_qp` makes next takes (`id->srq`); its PD the given one or the id's, and an XRC
/// SRQ's domain and CQ, when not given, the device's XRC domain of this library and a receive
/// CQ of the id's. `EINVAL` without `IBV_SRQ_INIT_ATTR_TYPE`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        // SAFETY: NULL or the application's attributes.
        let Some(a) = (unsafe { attr.as_mut() }) else { return fail_with(libc::EINVAL) };
        create_srq(id, a)
    })
}

fn create_srq(id: *mut rdma_cm_id, a: &mut ibv_srq_init_attr_ex) -> c_int {
    use super::xrc::{
        IBV_SRQ_INIT_ATTR_CQ as CQ, IBV_SRQ_INIT_ATTR_PD as PD, IBV_SRQ_INIT_ATTR_TYPE as TYPE,
        IBV_SRQ_INIT_ATTR_XRCD as XRCD, IBV_SRQT_XRC,
    };
    let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
    if s.id.verbs.is_null() || a.comp_mask & TYPE == 0 {
        return fail_with(libc::EINVAL);
    }
    if a.comp_mask & PD == 0 || a.pd.is_null() {
        (a.pd, a.comp_mask) = (s.id.pd, a.comp_mask | PD);
    }
    let c = id.cast::<ShimCmId>();
    let mut made_cq = false;
    if a.srq_type == IBV_SRQT_XRC {
        if a.comp_mask & XRCD == 0 || a.xrcd.is_null() {
            a.xrcd = device_xrcd(s.id.verbs);
            if a.xrcd.is_null() {
                return -1;
            }
            a.comp_mask |= XRCD;
        }
        if (a.comp_mask & CQ == 0 || a.cq.is_null()) && s.id.recv_cq.is_null() {
            // SAFETY: the id's device context.
            let Some((ch, cq)) = (unsafe { channel_and_cq(s.id.verbs, a.attr.max_wr, id.cast()) })
            else {
                return fail_with(libc::ENOMEM);
            };
            // SAFETY: a live id of ours.
            unsafe { ((*c).id.recv_cq_channel, (*c).id.recv_cq) = (ch, cq) };
            made_cq = true;
        }
        if a.comp_mask & CQ == 0 || a.cq.is_null() {
            a.cq = s.id.recv_cq;
        }
        a.comp_mask |= XRCD | CQ;
    }
    // SAFETY: the id's context and the attributes above, checked inside.
    let srq = unsafe { super::xrc::create_srq_ex(s.id.verbs, a) };
    if srq.is_null() {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
        if made_cq {
            // SAFETY: what was made here, not handed out.
            unsafe { destroy_own_cqs(c) };
        }
        return fail_with(errno);
    }
    // SAFETY: a live id of ours.
    unsafe {
        if (*c).id.pd.is_null() {
            (*c).id.pd = a.pd;
        }
        (*c).id.srq = srq;
    }
    if made_cq {
        s.extra.lock().own_cqs = true;
    }
    0
}

/// `rdma_destroy_srq(id)`: destroys `id->srq` (and the CQs the id made).
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_destroy_srq(id: *mut rdma_cm_id) {
    ffi!((), {
        let Some(s) = cm_id(id) else { return };
        let c = id.cast::<ShimCmId>();
        // SAFETY: a live id of ours; its SRQ is ours or NULL (the registry checks).
        unsafe {
            let srq = std::mem::replace(&mut (*c).id.srq, ptr::null_mut());
            if !srq.is_null() {
                super::srq::rdma_emu_shim__ibv_destroy_srq(srq);
            }
        }
        if std::mem::take(&mut s.extra.lock().own_cqs) {
            // SAFETY: a live id of ours; its QP (if any) no longer uses them, as in librdmacm.
            unsafe { destroy_own_cqs(c) };
        }
    })
}

/// `rdma_set_local_ece(id, ece)`: the ECE to offer for an id whose QP the application
/// connects itself. `EINVAL` for an id with a QP, NULL, vendor 0 or `comp_mask` bits.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_set_local_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        // SAFETY: NULL or the application's ECE.
        let (Some(s), Some(e)) = (cm_id(id), unsafe { ece.as_ref() }) else {
            return fail_with(libc::EINVAL);
        };
        let ece =
            rdma_emu::Ece { vendor_id: e.vendor_id, options: e.options, comp_mask: e.comp_mask };
        done(s.emu.set_local_ece(ece))
    })
}

/// `rdma_get_remote_ece(id, ece)`: the ECE the other side sent (vendor 0: none), for an id
/// without a QP (`EINVAL` otherwise).
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_get_remote_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        // SAFETY: NULL or writable, as the application promises.
        let (Some(s), Some(out)) = (cm_id(id), unsafe { ece.as_mut() }) else {
            return fail_with(libc::EINVAL);
        };
        match s.emu.remote_ece() {
            Ok(e) => {
                *out = ibv_ece { vendor_id: e.vendor_id, options: e.options, comp_mask: 0 };
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// `rdma_reject_ece(id, private_data, private_data_len)`: `rdma_reject` with the reason
/// "vendor option not supported" (35).
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_reject_ece(
    id: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        // SAFETY: `len` readable bytes at `data` (or NULL), as the application promises.
        let private = unsafe { private_bytes(data, len) };
        done(s.emu.reject_ece(private))
    })
}

/// The `len` bytes at `data` (none for NULL).
///
/// # Safety
/// `data` is NULL or has `len` readable bytes that outlive the use.
unsafe fn private_bytes<'a>(data: *const c_void, len: u8) -> &'a [u8] {
    if data.is_null() {
        &[]
    } else {
        // SAFETY: by the caller's contract.
        unsafe { std::slice::from_raw_parts(data.cast(), len.into()) }
    }
}

/// `rdma_create_ep(id, res, pd, qp_init_attr)`: a synchronous id for the address `res`
/// names: bound to it (`RAI_PASSIVE`; the QP attributes are then kept for the ids of
/// `rdma_get_request`), or resolved toward it with a QP made when attributes are given.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_create_ep(
    out: *mut *mut rdma_cm_id,
    res: *const rdma_addrinfo,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        // SAFETY: NULL or the application's address info.
        let Some(r) = (unsafe { res.as_ref() }) else { return fail_with(libc::EINVAL) };
        if out.is_null() {
            return fail_with(libc::EINVAL);
        }
        let ps = PortSpace::from_code(r.ai_port_space as u32).unwrap_or(PortSpace::Tcp);
        let p = match create_id(ptr::null_mut(), ptr::null_mut(), ps) {
            Ok(p) => p,
            Err(e) => return fail_with(e),
        };
        let id = p.cast::<rdma_cm_id>();
        if r.ai_qp_type != 0 {
            // SAFETY: just made, ours.
            unsafe { (*p).id.qp_type = r.ai_qp_type as u32 };
        }
        let src = if r.ai_src_len != 0 { r.ai_src_addr } else { ptr::null_mut() };
        // SAFETY: our id, the application's addresses and attributes.
        let ok = unsafe {
            if r.ai_flags & RAI_PASSIVE != 0 {
                let bound = rdma_emu_shim__rdma_emu_cm__rdma_bind_addr(id, src) == 0;
                if bound && !attr.is_null() {
                    (*attr).qp_type = r.ai_qp_type as u32;
                    (*p).extra.lock().qp_init = Some((ptr::read(attr), pd));
                }
                bound
            } else {
                if !attr.is_null() {
                    (*attr).qp_type = r.ai_qp_type as u32;
                }
                rdma_emu_shim__rdma_emu_cm__rdma_resolve_addr(id, src, r.ai_dst_addr, 2000) == 0
                    && rdma_emu_shim__rdma_emu_cm__rdma_resolve_route(id, 2000) == 0
                    && (attr.is_null()
                        || rdma_emu_shim__rdma_emu_cm__rdma_create_qp(id, pd, attr) == 0)
            }
        };
        if !ok {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
            // SAFETY: the id just made, not handed out.
            unsafe { rdma_emu_shim__rdma_emu_cm__rdma_destroy_id(id) };
            return fail_with(errno);
        }
        // SAFETY: `out` is writable (checked non-NULL).
        unsafe { *out = id };
        0
    })
}

/// `rdma_destroy_ep(id)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_destroy_ep(id: *mut rdma_cm_id) {
    // SAFETY: NULL or an id of ours, not used afterwards.
    unsafe {
        rdma_emu_shim__rdma_emu_cm__rdma_destroy_qp(id);
        rdma_emu_shim__rdma_emu_cm__rdma_destroy_id(id);
    }
}

/// `rdma_get_request(listen, id)`: waits on a synchronous listener for the next connection
/// request; its id is synchronous too (a channel of its own), holds the request as
/// `id->event`, and gets a QP if the listener came from `rdma_create_ep` with attributes.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_get_request(
    listen: *mut rdma_cm_id,
    out: *mut *mut rdma_cm_id,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(l) = cm_id(listen) else { return fail_with(libc::EINVAL) };
        let (sync, qp_init) = {
            let x = l.extra.lock();
            // SAFETY: a copy of plain C data.
            (x.sync, x.qp_init.as_ref().map(|(a, pd)| (unsafe { ptr::read(a) }, *pd)))
        };
        if sync.is_null() || out.is_null() {
            return fail_with(libc::EINVAL);
        }
        let mut ev: *mut rdma_cm_event = ptr::null_mut();
        // SAFETY: the listener's private channel; `ev` is writable.
        if unsafe { rdma_emu_shim__rdma_emu_cm__rdma_get_cm_event(sync, &mut ev) } != 0 {
            return -1;
        }
        // SAFETY: the event just received.
        let (kind, status, id) = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
        let refuse = |errno| {
            // SAFETY: the event just received, ours.
            unsafe { rdma_emu_shim__rdma_emu_cm__rdma_ack_cm_event(ev) };
            fail_with(errno)
        };
        if status != 0 {
            return refuse(if status < 0 { -status } else { libc::EINVAL });
        }
        if kind != CmEventType::ConnectRequest.code() {
            return refuse(libc::EINVAL);
        }
        // The new id waits on a channel of its own.
        // SAFETY: makes a channel of ours.
        let own = unsafe { rdma_emu_shim__rdma_emu_cm__rdma_create_event_channel() };
        let Some(s) = cm_id(id) else { return refuse(libc::EINVAL) };
        // SAFETY: NULL or the channel just made.
        let Some(c) = (unsafe { obj::<_, ShimCmChannel>(own) }) else {
            return refuse(libc::ENOMEM);
        };
        if let Err(e) = s.emu.migrate(&c.emu) {
            return refuse(e.errno().raw());
        }
        {
            let mut x = s.extra.lock();
            (x.sync, x.event) = (own, ev);
        }
        // SAFETY: a live id of ours.
        unsafe {
            (*id.cast::<ShimCmId>()).id.channel = own;
            (*id.cast::<ShimCmId>()).id.event = ev;
        }
        if let Some((mut a, pd)) = qp_init {
            // SAFETY: our id; a copy of the listener's attributes.
            if unsafe { rdma_emu_shim__rdma_emu_cm__rdma_create_qp(id, pd, &mut a) } != 0 {
                let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
                // SAFETY: the id just handed to nobody.
                unsafe { rdma_emu_shim__rdma_emu_cm__rdma_destroy_id(id) };
                return fail_with(errno);
            }
        }
        // SAFETY: `out` is writable (checked non-NULL).
        unsafe { *out = id };
        0
    })
}

/// `rdma_migrate_id(id, channel)`: the id's events go to `channel` from now on, those unread
/// with them (NULL: a channel of its own, synchronous mode). An id leaving synchronous mode
/// lets go of the event it kept as `id->event`, as librdmacm.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_migrate_id(
    id: *mut rdma_cm_id,
    ch: *mut rdma_event_channel,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        // Into synchronous mode once more: librdmacm refuses.
        if ch.is_null() && !s.extra.lock().sync.is_null() {
            return fail_with(libc::EINVAL);
        }
        let target = if ch.is_null() {
            // SAFETY: makes a channel of ours.
            unsafe { rdma_emu_shim__rdma_emu_cm__rdma_create_event_channel() }
        } else {
            ch
        };
        // SAFETY: NULL or a channel of ours.
        let Some(c) = (unsafe { obj::<_, ShimCmChannel>(target) }) else {
            return fail_with(libc::EINVAL);
        };
        if let Err(e) = s.emu.migrate(&c.emu) {
            if ch.is_null() {
                // SAFETY: the channel made above, which nothing else holds.
                unsafe { rdma_emu_shim__rdma_emu_cm__rdma_destroy_event_channel(target) };
            }
            return fail(e);
        }
        // Out of synchronous mode: its private channel, and the event it kept there.
        let left_sync = {
            let mut x = s.extra.lock();
            let old =
                std::mem::replace(&mut x.sync, if ch.is_null() { target } else { ptr::null_mut() });
            (!old.is_null() && old != target)
                .then(|| (old, std::mem::replace(&mut x.event, ptr::null_mut())))
        };
        // SAFETY: a live id of ours; its old private channel and the event it kept there are
        // no one else's.
        unsafe {
            (*id.cast::<ShimCmId>()).id.channel = target;
            if let Some((old, kept)) = left_sync {
                // Acknowledged, as librdmacm does.
                (*id.cast::<ShimCmId>()).id.event = ptr::null_mut();
                if !kept.is_null() {
                    rdma_emu_shim__rdma_emu_cm__rdma_ack_cm_event(kept);
                }
                rdma_emu_shim__rdma_emu_cm__rdma_destroy_event_channel(old);
            }
        }
        // No event of the id is read from the old channel after the move (librdmacm waits so
        // too).
        wait_for_acks(s, "rdma_migrate_id", |x| x.reported - x.acked);
        0
    })
}

/// `rdma_get_devices(num_devices)`: the contexts of every device, NULL-terminated; freed by
/// `rdma_free_devices`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_get_devices(
    num: *mut c_int,
) -> *mut *mut ibv_context {
    ffi!(ptr::null_mut(), {
        let n = super::device::devices().len();
        // SAFETY: calloc of n + 1 pointers; NULL on failure.
        let list = unsafe { libc::calloc(n + 1, size_of::<*mut ibv_context>()) }
            .cast::<*mut ibv_context>();
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return ptr::null_mut();
        }
        for i in 0..n {
            // SAFETY: i < n + 1 slots.
            unsafe { *list.add(i) = device_context(i as u32) };
        }
        if !num.is_null() {
            // SAFETY: writable when non-NULL.
            unsafe { *num = n as c_int };
        }
        list
    })
}

/// `rdma_free_devices(list)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_free_devices(
    list: *mut *mut ibv_context,
) {
    // SAFETY: a list rdma_get_devices allocated with calloc (or NULL).
    unsafe { libc::free(list.cast()) };
}

/// The port (network order) of a `sockaddr_storage`.
fn port_of(storage: &[u64; 16]) -> u16 {
    let p = storage.as_ptr().cast::<u8>();
    // SAFETY: sin_port and sin6_port both sit at byte 2 of the storage, a u16 in network order.
    unsafe { p.add(2).cast::<u16>().read_unaligned() }
}

/// `rdma_get_src_port(id)`: the local port, in network order.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_get_src_port(
    id: *mut rdma_cm_id,
) -> u16 {
    cm_id(id).map_or(0, |s| port_of(&s.id.route.addr.src_storage))
}

/// `rdma_get_dst_port(id)`: the peer's port, in network order.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_get_dst_port(
    id: *mut rdma_cm_id,
) -> u16 {
    cm_id(id).map_or(0, |s| port_of(&s.id.route.addr.dst_storage))
}

const RAI_PASSIVE: c_int = 1;
const RAI_NUMERICHOST: c_int = 2;
const AF_IB: c_int = 27;
const IBV_QPT_RC: c_int = 2;
const IBV_QPT_UC: c_int = 3;
const IBV_QPT_UD: c_int = 4;
const IBV_QPT_XRC_SEND: c_int = 9;
const IBV_QPT_XRC_RECV: c_int = 10;

/// A malloc'd copy of `len` bytes at `src` (freed by `rdma_freeaddrinfo`), or NULL.
///
/// # Safety
/// `src` is readable for `len` bytes.
unsafe fn malloc_copy<T>(src: *const T, len: usize) -> *mut T {
    // SAFETY: malloc of `len` bytes; NULL on failure.
    let p = unsafe { libc::malloc(len.max(1)) }.cast::<T>();
    if !p.is_null() {
        // SAFETY: both ranges hold `len` bytes and do not overlap (a fresh allocation).
        unsafe { ptr::copy_nonoverlapping(src.cast::<u8>(), p.cast::<u8>(), len) };
    }
    p
}

/// `rdma_getaddrinfo(node, service, hints, res)`: the address of `node:service` for the CM,
/// through getaddrinfo(3), as the source (with `RAI_PASSIVE`) or the destination; the QP type
/// and port space come from the hints, else from the kind of socket the address is for.
/// -1 with `errno` the getaddrinfo error (or `EINVAL`, `EAFNOSUPPORT` for `AF_IB` hints).
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        if (node.is_null() && service.is_null() && hints.is_null()) || res.is_null() {
            return fail_with(libc::EINVAL);
        }
        // SAFETY: NULL or the application's hints.
        let h = unsafe { hints.as_ref() };
        if h.is_some_and(|h| h.ai_family == AF_IB) {
            return fail_with(libc::EAFNOSUPPORT);
        }
        // SAFETY: all-zero is a valid rdma_addrinfo (NULL pointers, zero numbers).
        let mut rai: rdma_addrinfo = unsafe { std::mem::zeroed() };
        if let Some(h) = h {
            (rai.ai_flags, rai.ai_family) = (h.ai_flags, h.ai_family);
            (rai.ai_qp_type, rai.ai_port_space) = (h.ai_qp_type, h.ai_port_space);
        }
        if !node.is_null() || !service.is_null() {
            // SAFETY: all-zero is a valid addrinfo.
            let mut ai_hints: libc::addrinfo = unsafe { std::mem::zeroed() };
            if let Some(h) = h {
                if h.ai_flags & RAI_PASSIVE != 0 {
                    ai_hints.ai_flags |= libc::AI_PASSIVE;
                }
                if h.ai_flags & RAI_NUMERICHOST != 0 {
                    ai_hints.ai_flags |= libc::AI_NUMERICHOST;
                }
                ai_hints.ai_family = h.ai_family;
                ai_hints.ai_socktype = match h.ai_qp_type {
                    IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => {
                        libc::SOCK_STREAM
                    }
                    IBV_QPT_UD => libc::SOCK_DGRAM,
                    _ => 0,
                };
                ai_hints.ai_protocol = match PortSpace::from_code(h.ai_port_space as u32) {
                    Some(PortSpace::Tcp) => libc::IPPROTO_TCP,
                    Some(PortSpace::Udp | PortSpace::Ipoib) => libc::IPPROTO_UDP,
                    Some(PortSpace::Ib) if ai_hints.ai_socktype == libc::SOCK_STREAM => {
                        libc::IPPROTO_TCP
                    }
                    Some(PortSpace::Ib) if ai_hints.ai_socktype == libc::SOCK_DGRAM => {
                        libc::IPPROTO_UDP
                    }
                    _ => 0,
                };
            }
            let mut ai: *mut libc::addrinfo = ptr::null_mut();
            let hp = if h.is_some() { &ai_hints as *const libc::addrinfo } else { ptr::null() };
            // SAFETY: NUL-terminated strings or NULL, valid hints or NULL, `ai` writable.
            let r = unsafe { libc::getaddrinfo(node, service, hp, &mut ai) };
            if r != 0 {
                // getaddrinfo's own code (`EAI_NONAME`, ...), as librdmacm returns it.
                return r;
            }
            // A result's flags say only whether it is passive (librdmacm's, measured on rxe).
            rai.ai_flags = 0;
            // SAFETY: getaddrinfo succeeded: `ai` is a valid list with at least one entry.
            let a = unsafe { &*ai };
            if rai.ai_qp_type == 0 {
                rai.ai_qp_type = match a.ai_socktype {
                    libc::SOCK_STREAM => IBV_QPT_RC,
                    libc::SOCK_DGRAM => IBV_QPT_UD,
                    _ => 0,
                };
            }
            if rai.ai_port_space == 0 {
                rai.ai_port_space = match a.ai_protocol {
                    libc::IPPROTO_TCP => PortSpace::Tcp.code() as c_int,
                    libc::IPPROTO_UDP => PortSpace::Udp.code() as c_int,
                    _ => 0,
                };
            }
            rai.ai_family = a.ai_family;
            // SAFETY: ai_addr holds ai_addrlen bytes.
            let addr = unsafe { malloc_copy(a.ai_addr, a.ai_addrlen as usize) };
            let canon = if a.ai_canonname.is_null() {
                ptr::null_mut()
            } else {
                // SAFETY: a NUL-terminated name.
                unsafe { libc::strdup(a.ai_canonname) }
            };
            if a.ai_flags & libc::AI_PASSIVE != 0 {
                rai.ai_flags = RAI_PASSIVE;
                (rai.ai_src_addr, rai.ai_src_len, rai.ai_src_canonname) =
                    (addr, a.ai_addrlen, canon);
            } else {
                (rai.ai_dst_addr, rai.ai_dst_len, rai.ai_dst_canonname) =
                    (addr, a.ai_addrlen, canon);
            }
            // SAFETY: the list getaddrinfo returned.
            unsafe { libc::freeaddrinfo(ai) };
        } else if let Some(h) = h.filter(|h| h.ai_dst_len != 0 && !h.ai_dst_addr.is_null()) {
            // SAFETY: the hints' address holds ai_dst_len bytes.
            rai.ai_dst_addr = unsafe { malloc_copy(h.ai_dst_addr, h.ai_dst_len as usize) };
            rai.ai_dst_len = h.ai_dst_len;
        }
        if let Some(h) =
            h.filter(|h| rai.ai_src_len == 0 && h.ai_src_len != 0 && !h.ai_src_addr.is_null())
        {
            // SAFETY: the hints' address holds ai_src_len bytes.
            rai.ai_src_addr = unsafe { malloc_copy(h.ai_src_addr, h.ai_src_len as usize) };
            rai.ai_src_len = h.ai_src_len;
        }
        // SAFETY: a copy of `rai`, freed by rdma_freeaddrinfo.
        let out = unsafe { malloc_copy(&rai, size_of::<rdma_addrinfo>()) };
        if out.is_null() {
            return fail_with(libc::ENOMEM);
        }
        // SAFETY: `res` is writable (checked non-NULL).
        unsafe { *res = out };
        0
    })
}

/// `rdma_freeaddrinfo(res)`.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_freeaddrinfo(
    mut res: *mut rdma_addrinfo,
) {
    while !res.is_null() {
        // SAFETY: a list rdma_getaddrinfo built with malloc; each part freed once.
        unsafe {
            let next = (*res).ai_next;
            for p in [
                (*res).ai_connect,
                (*res).ai_route,
                (*res).ai_src_canonname.cast(),
                (*res).ai_dst_canonname.cast(),
                (*res).ai_src_addr.cast(),
                (*res).ai_dst_addr.cast(),
            ] {
                libc::free(p);
            }
            libc::free(res.cast());
            res = next;
        }
    }
}

/// `rdma_set_option(id, level, optname, optval, optlen)`: at `RDMA_OPTION_ID` (0), TOS (0,
/// a `uint8_t`), REUSEADDR (1, an `int`), AFONLY (2, an `int`) and ACK_TIMEOUT (3, a
/// `uint8_t`); `EINVAL` for a value of the wrong size, `ENOSYS` for an option the kernel does
/// not know, `EOPNOTSUPP` for `RDMA_OPTION_IB_PATH` (no path records to set here).
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *const c_void,
    optlen: usize,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        if optval.is_null() {
            return fail_with(libc::EINVAL);
        }
        let byte = || {
            // SAFETY: a one-byte value, as its length says (checked by the caller below).
            unsafe { optval.cast::<u8>().read() }
        };
        let int = || {
            // SAFETY: an int, as its length says (checked by the caller below).
            unsafe { optval.cast::<c_int>().read_unaligned() }
        };
        let res = match (level, optname, optlen) {
            (0, 0, 1) => {
                s.emu.set_tos(byte());
                Ok(())
            }
            (0, 1, 4) => s.emu.set_reuse_addr(int() != 0),
            (0, 2, 4) => s.emu.set_af_only(int() != 0),
            (0, 3, 1) => s.emu.set_ack_timeout(byte()),
            (0, 0..=3, _) => return fail_with(libc::EINVAL),
            (1, 1, _) => return fail_with(libc::EOPNOTSUPP),
            _ => return fail_with(libc::ENOSYS),
        };
        done(res)
    })
}

/// `rdma_init_qp_attr(id, qp_attr, qp_attr_mask)`: the attributes (and mask) that take the
/// id's QP to `qp_attr->qp_state` (INIT, RTR or RTS), as the connection sets them.
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        // SAFETY: NULL or the caller's attributes and mask.
        let (Some(a), Some(m)) = (unsafe { qp_attr.as_mut() }, unsafe { qp_attr_mask.as_mut() })
        else {
            return fail_with(libc::EINVAL);
        };
        match s.emu.init_qp_attr(rdma_emu::QpState(a.qp_state)) {
            Ok((attr, mask)) => {
                *a = super::qp::qp_attr_to_c(&attr);
                *m = mask.bits() as c_int;
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// `IBV_EVENT_COMM_EST`.
const IBV_EVENT_COMM_EST: u32 = 4;

/// `rdma_notify(id, event)`: `IBV_EVENT_COMM_EST` establishes an accepted connection whose
/// QP took a message before the RTU (as the kernel's CM does); other events are `EINVAL`
/// (there is no path migration).
pub(crate) unsafe extern "C" fn rdma_emu_shim__rdma_emu_cm__rdma_notify(
    id: *mut rdma_cm_id,
    event: u32,
) -> c_int {
    ffi!(fail_with(libc::EIO), {
        let Some(s) = cm_id(id) else { return fail_with(libc::EINVAL) };
        if event != IBV_EVENT_COMM_EST {
            return fail_with(libc::EINVAL);
        }
        done(s.emu.notify_established())
    })
}
