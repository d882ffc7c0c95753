//! What the processes on one host share, below every layer that uses it: the one-way rings a
//! node's messages travel in without a system call ([`ring`]), and the sealed table of
//! exports a process publishes for its peers to act on while it is stopped ([`exports`]).
//! The host fabric (`fabric::host`) builds its links on them; the engine names a ring's
//! records (a packet whose payload borrows one) and the requests a peer carries out.

pub(crate) mod exports;
pub(crate) mod ring;
