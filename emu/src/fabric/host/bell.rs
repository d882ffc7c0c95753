//! The doorbell held while a request is sent for its requester to carry out, and the records
//! written claimed for it.

use std::cell::{Cell, RefCell};

use super::*;

/// Runs `send` with the doorbell held (as `hold` says which): a message it sends to a peer
/// whose reader asks for it does not wake the reader yet. Whether one would have; if so,
/// [`release_bell`] must follow (a request its sender carries out at once needs no reader:
/// only accounting for, whenever it next wakes).
pub(crate) fn holding_bell<R>(hold: Hold, send: impl FnOnce() -> R) -> (R, bool) {
    this_thread::hold_bell::set(hold as u64);
    let sent = send();
    this_thread::hold_bell::set(0);
    (sent, HELD_BELL.with_borrow(Option::is_some))
}

/// Which bells [`holding_bell`] holds.
/// (Its value is what `this_thread::hold_bell` holds while it is held; 0 there: none.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum Hold {
    /// Every one: a run of WRITEs carried out as they are sent wakes no reader, nor does a
    /// ping-pong's (see `engine::absent_peer::send_placing`).
    All = 1,
    /// Only that of a reader napping on its application's looks (see `Ring::take_bell`); one
    /// asleep is woken as the message is written, as usual, and stays awake for what follows.
    Napping = 2,
}

/// After [`holding_bell`]: rings the held bell if `wake`; else asks for it again (the next
/// message rings it), unless another message waits unbegun in the ring meanwhile.
pub(crate) fn release_bell(wake: bool) {
    if let Some((peer, bell)) = HELD_BELL.take() {
        peer.release_bell(wake, bell);
    }
}

/// Runs `send` (of a request through the packet path) with the record it writes of a request
/// that lands (see `Ring::take_bell`), if it writes it in one, written claimed (see
/// `ring::Marks::claimed`), and returns what [`Node::settle`] must be given for it after
/// the attempt to carry it out: nobody at the peer begins it before. (A request carried out
/// as it is sent then never loses the race to the peer's reader, or to a thread of the peer
/// looking at its rings, which would leave it outstanding, and the next WRITE not alone.)
pub(crate) fn claiming(send: impl FnOnce()) -> Option<Claimed> {
    CLAIM_WRITTEN.set(true);
    send();
    CLAIM_WRITTEN.set(false);
    CLAIMED.take()
}

/// How a message goes written whole (see [`Node::send_whole`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Whole {
    /// A request a lagging peer's requester might carry out (a WRITE or READ: see
    /// `Node::carry_out_for_lagging`).
    pub(crate) carriable: bool,
    /// One whose effect no completion announces to the peer (see `Ring::take_bell`), sent
    /// alone: nothing else of its QP's outstanding (the requester waits for it, or for what
    /// it makes the peer's application send back).
    pub(crate) lands: bool,
    /// A WRITE its requester tries to carry out next: written claimed where the peer's reader
    /// is not at work (asleep, or napping on its application's looks), the napping one's bell
    /// left to [`Node::settle`].
    pub(crate) placing: bool,
}

/// A request sent for its requester to carry out next: what [`Node::settle`] is given after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claimed {
    /// The peer's slot.
    pub(super) slot: u8,
    /// Where its record lies in our ring to the peer, if written claimed (the peer's reader
    /// not at work).
    pub(crate) at: Option<u32>,
    /// The peer's reader napped on its application's looks as the request was sent.
    pub(super) napping: bool,
}

impl Claimed {
    /// Whether no thread of the peer is at work taking records in as they come: its reader
    /// asleep, or napping on its application's looks.
    pub(crate) fn unattended(&self) -> bool {
        self.at.is_some() || self.napping
    }
}

/// Whether this thread's sends rang a peer's bell (found its reader asleep) since it last
/// asked.
pub(crate) fn rang_bell() -> bool {
    this_thread::rang::replace(0) != 0
}

thread_local! {
    /// See [`claiming`].
    pub(super) static CLAIM_WRITTEN: Cell<bool> = const { Cell::new(false) };
    /// The record this thread wrote claimed (see [`claiming`]).
    pub(super) static CLAIMED: Cell<Option<Claimed>> = const { Cell::new(None) };
    /// The peer whose doorbell this thread holds (see [`holding_bell`]), and the reader's
    /// request for it that was taken.
    pub(super) static HELD_BELL: RefCell<Option<(Arc<Peer>, u32)>> = const { RefCell::new(None) };
}
