//! # rdma-emu: a software-emulated RDMA verbs provider
//!
//! Devices, protection domains, memory regions, completion queues, completion channels, async
//! events, UC queue pairs, and RC queue pairs with a real transport (PSNs, ACK/NAK, RNR and retransmission
//! timers, READ/atomic responder resources), on a fabric that lives in this process. No NIC, no
//! kernel module, no root.
//!
//! ```
//! use rdma_emu::*;
//! let fabric = Fabric::new(FabricConfig::default());
//! let dev = &fabric.devices()[0];
//! let ctx = dev.open().unwrap();
//! let pd = ctx.alloc_pd().unwrap();
//! let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
//! assert_eq!(mr.length(), 4096);
//! assert_eq!(pd.dealloc().unwrap_err().errno(), Errno::EBUSY); // the MR still uses it
//! ```
//!
//! ## Layers
//!
//! From the bottom up; a module imports those above it in this table, not those below:
//!
//! | module | what it holds |
//! |---|---|
//! | `types` | the verbs' value types, with their `<infiniband/verbs.h>` numbers |
//! | `mem`, `guarded`, [`sync`], `sys`, `shared_mem`, `error` | the one place that reads and writes registered memory, and the copies that survive its unmapping; locks and fences; system calls; memory moved into shared memory; errors as errnos |
//! | `frame` | Ethernet and IP headers: parsing, checksums, RSS hashing, TSO (bytes in, bytes out) |
//! | `ipc` | what processes on one host share: the message rings, the sealed export table |
//! | `packet`, `wire` | the message two QPs exchange (what the wire headers carry), PSN arithmetic; its byte form between processes |
//! | [`profile`] | device and port attribute tables (`rxe` exact, `full`) |
//! | `objects` | device, context, PD, MR (key space), CQ, completion channel, async events; a receive's scatter list filled (`objects::sgl`) |
//! | [`qp`] | the QP object; [`qp::state`] holds the `const` state-transition tables |
//! | `events` | async events as the application reads them (an element may be a QP) |
//! | `engine` | requester / responder / completer, the express path, the inline driver; the QP verbs that set them going (`post_send`, `post_recv`, `modify`'s transitions) |
//! | `fabric` | routing between devices by GID/LID + QPN; the clock and timer that fire retries; fault rules; packet traces (pcap); the host fabric between processes |
//! | [`cm`] | the connection manager (librdmacm's `rdma_cm`), above the fabric: the fabric hands it what arrives for it through an agent it is made with (`fabric::CmAgent`, see [`Fabric::try_new`]) |
//! | [`rsocket`] | rsockets, over the connection manager |
//!
//! Where the table is not yet true: `objects` names the fabric (a context holds it, for the
//! clock, the timer and a thread's progress), the QP calls it through its context without
//! naming it (its number registered and looked up, multicast groups, the route to its peer),
//! and the engine names the fabric (the host fabric's nodes, and the express path's checks
//! of ports and detours). The fabric is the hub every object reaches through its context:
//! breaking the circle means the layers below reaching it through a trait of their own.
//!
//! ## Thread safety
//!
//! Every handle is `Send + Sync` and cheap to clone; verbs may be called from any number of
//! threads at once, as with libibverbs. Each QP and CQ has its own lock; no thread ever holds
//! two QP locks, so concurrent traffic between any set of QPs cannot deadlock, and packets
//! between two QPs are delivered in order.
//!
//! ## Progress
//!
//! Work runs inline: a `post_send` carries its message through the fabric, the responder and
//! the completer before it returns (the *inline driver*), so a single-threaded program sees
//! completions with no helper thread. Deadlines (RNR back-off, retransmission timeouts) are
//! served by one timer thread per fabric, started the first time a deadline is armed, so
//! retries fire even while the application is blocked.
//!
//! ## Faults and simulation
//!
//! [`FaultRule`]s make the fabric drop, corrupt, delay, duplicate or reorder packets, partition
//! devices, force RNR NAKs, take ports down, fail devices and overrun CQs
//! ([`Fabric::set_faults`]). With [`FabricConfig::seed`] the fabric is a simulation: time is
//! virtual (it jumps to the next deadline when the program polls an empty CQ) and every random
//! choice comes from the seed, so a single-threaded program replays exactly.
//!
//! ## Resource cleanup
//!
//! Objects are destroyed explicitly, in the verbs order (QPs, then CQs and MRs, then PDs and
//! channels): destroying an object still in use fails with `EBUSY`, and using a destroyed one
//! fails with `EINVAL`. Dropping the last handle of an object that was never destroyed
//! releases it too. `Qp::destroy` and `Cq::destroy` wait until every event handed to the
//! application about them was acknowledged, as the man pages specify.
//!
//! ## Errors
//!
//! Every fallible verb returns [`Error`], whose [`Error::errno`] is what rdma-core's rxe
//! provider returns for the same failure. Work-completion statuses are those rxe produces,
//! except where the InfiniBand specification says otherwise (see `docs/divergences.md`).
#![deny(unsafe_code)]

#[cfg(test)]
mod captured;
pub mod cm;
mod engine;
mod error;
mod events;
mod fabric;
mod frame;
mod guarded;
mod ipc;
mod mem;
mod objects;
mod packet;
pub mod profile;
pub mod qp;
pub mod rsocket;
mod shared_mem;
pub mod sync;
mod sys;
mod types;
mod wire;

pub use crate::{
    engine::flow::{EthFilter, Flow, FlowAttr, FlowSpec, Ipv4ExtFilter, Ipv6Filter, PortFilter},
    error::{ConfigError, Errno, Error, Result},
    events::{AsyncEvent, EventElement},
    fabric::{
        Fabric, FabricConfig, PortWatch,
        faults::{FaultAction, FaultRule, PacketClass},
        host::{Flushed, HostDrops, fabric_dir, private_dir, root_dirs_on_the_way},
        trust::ROOT_DIRS_VAR,
        wire_port::WireDrops,
    },
    mem::RawMemory,
    objects::{
        ah::Ah,
        channel::CompChannel,
        context::Context,
        cq::{Cq, CqOptions},
        device::Device,
        dm::Dm,
        mr::{Mr, Rereg},
        mw::{Mw, MwBind, MwBindInfo},
        pd::Pd,
        recv_queue::RecvWr,
        srq::{Srq, SrqAttr, SrqOp, SrqOpKind, srq_attr_mask, tmh},
        wq::{RwqIndTable, Wq, WqInitAttr},
        xrcd::{FileId, Xrcd, xrcd_oflags},
    },
    profile::{DeviceAttr, GidEntry, OdpCaps, PortAttr, Profile, TmCaps, odp},
    qp::{Endpoint, Flush, Qp, QpAttr, QpCap, QpInitAttr, RcParams, RssConf, SendWr, Tso, UdDest},
    sys::fork_generation,
    types::*,
};

/// Where the layers meet: a fabric is made with the connection manager above it as the agent
/// it hands CM messages to (so that `fabric` names nothing above it).
impl Fabric {
    /// A fabric with `cfg.devices` devices named `emu0`, `emu1`, ...
    pub fn new(cfg: FabricConfig) -> Fabric {
        Fabric::try_new(cfg).expect("a fabric with a packet trace file that cannot be created")
    }

    /// [`new`](Self::new), failing only if the packet trace file cannot be created.
    pub fn try_new(cfg: FabricConfig) -> Result<Fabric> {
        Fabric::with_cm(cfg, Box::new(cm::Manager::new()))
    }
}
