//! What the two ends of an rsocket connection say to each other: the hello each puts in the
//! CM's private data, the immediates that mark messages, and the entries of the table through
//! which each end tells the other where it may write (`riomap`).
//!
//! Everything here comes from the peer, so decoding checks what it reads.

/// The protocol version both ends must speak.
pub(super) const VERSION: u8 = 1;

/// Entries in each end's table of the peer's I/O mappings (the most `RDMA_IOMAPSIZE` asks).
pub(super) const IOMAP_TABLE: usize = 16;
/// Bytes per table entry: offset, address, length (u64 each), rkey, valid (u32 each).
pub(super) const IOMAP_ENTRY: usize = 32;

/// The connection's parameters each end announces: where its receive ring is, how many data
/// messages it can take at once. Its table of the peer's mappings follows the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hello {
    /// Slots of its table of our mappings: how many `riomap`s we may announce to it.
    pub iomaps: u8,
    pub credits: u16,
    pub ring_len: u32,
    pub ring_addr: u64,
    pub rkey: u32,
}

/// Encoded size of [`Hello`]: it fits a REQ's private data (56 bytes).
pub(super) const HELLO_LEN: usize = 20;

impl Hello {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HELLO_LEN);
        b.extend_from_slice(&[VERSION, self.iomaps]);
        b.extend_from_slice(&self.credits.to_be_bytes());
        b.extend_from_slice(&self.ring_len.to_be_bytes());
        b.extend_from_slice(&self.ring_addr.to_be_bytes());
        b.extend_from_slice(&self.rkey.to_be_bytes());
        b
    }

    /// The peer's hello, or `None` for anything that is not one this version accepts.
    pub(super) fn decode(b: &[u8]) -> Option<Hello> {
        let b = b.get(..HELLO_LEN)?;
        if b[0] != VERSION {
            return None;
        }
        let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let h = Hello {
            iomaps: b[1],
            credits: u16_at(2),
            ring_len: u32_at(4),
            ring_addr: u64_at(8),
            rkey: u32_at(16),
        };
        let sane = h.credits > 0
            && (MIN_RING..=MAX_RING).contains(&(h.ring_len as usize))
            && usize::from(h.iomaps) <= IOMAP_TABLE;
        sane.then_some(h)
    }
}

/// Smallest and largest receive ring (`SO_RCVBUF` is held to these).
pub(super) const MIN_RING: usize = 4096;
pub(super) const MAX_RING: usize = 1 << 21;

/// What a message's immediate says. Data lands in the ring before its message completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Imm {
    /// `len` bytes were written at the receiver's ring tail.
    Data(u32),
    /// The receiver read `bytes` more from its ring and took `msgs` more data messages.
    Credit { msgs: u32, bytes: u32 },
    /// The sender will send no more (shutdown of its writing side).
    Fin,
}

const KIND: u32 = 30;
const MSGS: u32 = 22;
const LOW: u32 = (1 << MSGS) - 1;

impl Imm {
    pub(super) fn encode(self) -> u32 {
        match self {
            Imm::Data(len) => len & ((1 << KIND) - 1),
            Imm::Credit { msgs, bytes } => 1 << KIND | (msgs & 0xff) << MSGS | (bytes & LOW),
            Imm::Fin => 2 << KIND,
        }
    }

    pub(super) fn decode(v: u32) -> Option<Imm> {
        match v >> KIND {
            0 => Some(Imm::Data(v & ((1 << KIND) - 1))),
            1 => Some(Imm::Credit { msgs: (v >> MSGS) & 0xff, bytes: v & LOW }),
            2 if v & ((1 << KIND) - 1) == 0 => Some(Imm::Fin),
            _ => None,
        }
    }
}

/// Most data messages an end takes at once (a credit reports at most 255 of them).
pub(super) const MAX_CREDITS: u16 = 255;
/// Most bytes a credit reports (the ring is never larger).
const _: () = assert!(MAX_RING as u32 <= LOW);

/// One mapping in a table: the peer may write `len` bytes at `addr` (rkey `rkey`) for
/// offsets `offset..offset + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct IoMapEntry {
    pub offset: u64,
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
    pub valid: bool,
}

impl IoMapEntry {
    pub(super) fn encode(&self) -> [u8; IOMAP_ENTRY] {
        let mut b = [0u8; IOMAP_ENTRY];
        b[..8].copy_from_slice(&self.offset.to_ne_bytes());
        b[8..16].copy_from_slice(&self.addr.to_ne_bytes());
        b[16..24].copy_from_slice(&self.len.to_ne_bytes());
        b[24..28].copy_from_slice(&self.rkey.to_ne_bytes());
        b[28..32].copy_from_slice(&u32::from(self.valid).to_ne_bytes());
        b
    }

    pub(super) fn decode(b: &[u8; IOMAP_ENTRY]) -> IoMapEntry {
        let u64_at = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        IoMapEntry {
            offset: u64_at(0),
            addr: u64_at(8),
            len: u64_at(16),
            rkey: u32_at(24),
            valid: u32_at(28) == 1,
        }
    }

    /// Whether the entry takes a write at `offset`.
    pub(super) fn covers(&self, offset: u64) -> bool {
        self.valid && offset >= self.offset && offset - self.offset < self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediates_round_trip_and_junk_is_refused() {
        for imm in [
            Imm::Data(0),
            Imm::Data(65536),
            Imm::Credit { msgs: 255, bytes: MAX_RING as u32 },
            Imm::Credit { msgs: 0, bytes: 1 },
            Imm::Fin,
        ] {
            assert_eq!(Imm::decode(imm.encode()), Some(imm));
        }
        assert_eq!(Imm::decode(3 << 30), None);
        assert_eq!(Imm::decode(2 << 30 | 5), None);
    }

    #[test]
    fn a_hello_round_trips_and_a_bad_one_is_refused() {
        let h =
            Hello { iomaps: 2, credits: 120, ring_len: 1 << 17, ring_addr: 0xdead_0000, rkey: 77 };
        let b = h.encode();
        assert_eq!(b.len(), HELLO_LEN);
        assert_eq!(Hello::decode(&b), Some(h));
        let mut padded = b.clone();
        padded.resize(56, 0);
        assert_eq!(Hello::decode(&padded), Some(h), "private data comes padded");
        assert_eq!(Hello::decode(&b[..10]), None);
        let mut v = b.clone();
        v[0] = 9;
        assert_eq!(Hello::decode(&v), None, "another version");
        let huge = Hello { ring_len: u32::MAX, ..h };
        assert_eq!(Hello::decode(&huge.encode()), None);
        let none = Hello { credits: 0, ..h };
        assert_eq!(Hello::decode(&none.encode()), None);
        let big = Hello { iomaps: 17, ..h };
        assert_eq!(Hello::decode(&big.encode()), None);
    }

    #[test]
    fn a_mapping_covers_its_offsets_only() {
        let e = IoMapEntry { offset: 100, addr: 1, len: 10, rkey: 2, valid: true };
        assert_eq!(IoMapEntry::decode(&e.encode()), e);
        assert!(e.covers(100) && e.covers(109));
        assert!(!e.covers(99) && !e.covers(110));
        assert!(!IoMapEntry { valid: false, ..e }.covers(100));
    }
}
