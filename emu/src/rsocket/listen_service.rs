//! The listen service: a thread per process that accepts the connection requests of every
//! listening stream socket as they come, as librdmacm's rsockets do (its `listen_svc`, which
//! answers a request with `rdma_accept` at once and queues the new socket for `raccept`).
//!
//! So a client's `rconnect` completes whether or not the server is in `raccept` (as a TCP
//! backlog lets it), and one thread may connect to its own listener before it accepts — where
//! a listener that accepted only in `raccept` left such a client waiting for ever. `raccept`
//! still accepts what it finds itself (the thread is not needed for it to make progress: a
//! child made by `fork` starts its own only when it listens or accepts).
//!
//! The thread starts with the first listener and ends once none is left; it holds listeners
//! only weakly, so a socket dropped without `rclose` is not kept alive by it.

use std::{
    os::fd::AsRawFd,
    sync::{Arc, Weak},
};

use super::{Inner, RSocket};
use crate::{
    sync::Mutex,
    sys::{self, EventFd, ForkStage},
};

/// The process's service; `None` until a socket first listens. Held across `fork` (any
/// thread may be in [`service`] then).
static SERVICE: Mutex<Option<Arc<Service>>> = Mutex::new(None);

/// Held by the service's thread while it is awake (not asleep in `poll`), and by the thread
/// that forks across `fork`: the thread is then asleep, holding none of the locks (a
/// listener's, the CM's, the fabric's) that the child may take next, as it would have held
/// them for ever there.
static AWAKE: Mutex<()> = Mutex::new(());

#[derive(Debug)]
struct Service {
    /// Rung when a listener is added or closed, so the thread looks at its list again.
    bell: EventFd,
    list: Mutex<List>,
    /// The fork generation the service belongs to: a child made by `fork` has neither its
    /// parent's thread nor a bell of its own (the parent's descriptor is shared), so it makes
    /// a service of its own once it listens.
    generation: u64,
}

#[derive(Debug)]
struct List {
    listeners: Vec<Weak<Inner>>,
    /// Whether the thread runs (it clears this, under the list's lock, as it ends).
    running: bool,
}

/// Has the service accept `sock`'s requests from now on, starting its thread if need be.
pub(super) fn watch(sock: &RSocket) {
    let Some(service) = service(true) else { return };
    service.list.lock().listeners.push(Arc::downgrade(&sock.0));
    service.start();
    service.bell.post();
}

/// Makes sure the thread runs while listeners are watched (in a child made by `fork`, the
/// parent's thread is not there).
pub(super) fn ensure() {
    if let Some(service) = service(false) {
        service.start();
    }
}

/// Tells the thread to look at its list and every listener again (a listener closed, or a
/// request was taken off a listener's channel by another thread).
pub(super) fn changed() {
    if let Some(service) = service(false) {
        service.bell.post();
    }
}

/// This process's service, made if there is none (or only its parent's, in a child made by
/// `fork`) and `make`; `None` without a descriptor for its bell (`raccept` still accepts).
fn service(make: bool) -> Option<Arc<Service>> {
    let mut slot = SERVICE.lock();
    match &*slot {
        Some(s) if s.generation == sys::fork_generation() => return Some(s.clone()),
        // A child's service watches none of the listeners it inherited: they are its parent's,
        // and their channels' descriptors are the parent's too, so a request the child took
        // off one took the parent's count with it, and the parent's request waited for ever.
        _ if !make => return None,
        _ => {}
    }
    sys::hold_across_fork!(ForkStage::ListenService, AWAKE, ());
    sys::hold_across_fork!(ForkStage::ListenServiceSlot, SERVICE, Option<Arc<Service>>);
    let bell = EventFd::new().ok()?;
    let list = Mutex::new(List { listeners: Vec::new(), running: false });
    let service = Arc::new(Service { bell, list, generation: sys::fork_generation() });
    *slot = Some(service.clone());
    Some(service)
}

impl Service {
    /// Starts the thread unless it runs or there is nothing to watch.
    fn start(self: &Arc<Self>) {
        let mut list = self.list.lock();
        if list.running || list.listeners.is_empty() {
            return;
        }
        let me = self.clone();
        if sys::spawn("rdma-emu-listen".into(), move || me.run()).is_ok() {
            list.running = true;
        }
    }

    fn run(&self) {
        let pollin = |fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        loop {
            let awake = AWAKE.lock();
            // Weakly held while asleep: a listener dropped meanwhile goes. One whose accept
            // queue is full is not watched until `raccept` takes from it (its channel stays
            // readable meanwhile).
            let (watched, mut fds) = {
                let mut list = self.list.lock();
                let mut fds = vec![pollin(self.bell.as_raw_fd())];
                let mut watched = Vec::new();
                list.listeners.retain(|w| {
                    let Some(sock) = w.upgrade().map(RSocket) else { return false };
                    let Some(room) = sock.accept_queue_room() else { return false };
                    if room {
                        fds.push(pollin(sock.0.channel.as_raw_fd()));
                        watched.push(w.clone());
                    }
                    true
                });
                if list.listeners.is_empty() {
                    list.running = false;
                    return;
                }
                (watched, fds)
            };
            drop(awake);
            let polled = sys::poll(&mut fds, None);
            let _awake = AWAKE.lock();
            if polled.is_err() {
                continue; // (EINTR: every signal is blocked here, but a stop resumes)
            }
            // The bell also says that a request was taken off a channel by another thread's
            // call, or that `raccept` made room in a full queue: then every listener is looked
            // at (each look that finds none is cheap).
            let rung = fds[0].revents != 0;
            while self.bell.try_take() {}
            let ready: Vec<Weak<Inner>> = if rung {
                self.list.lock().listeners.clone()
            } else {
                let ready = fds[1..].iter().zip(watched).filter(|(p, _)| p.revents != 0);
                ready.map(|(_, w)| w).collect()
            };
            for inner in ready.iter().filter_map(Weak::upgrade) {
                RSocket(inner).serve();
            }
        }
    }
}
