//! The exported C functions, grouped like the verbs they implement. Each is thin: check
//! pointers, recover the object, call the emulator, map the result to an errno or NULL.

pub(crate) mod cm;
pub(crate) mod control;
pub(crate) mod cq;
pub(crate) mod device;
pub(crate) mod dm;
pub(crate) mod events;
pub(crate) mod import;
pub(crate) mod marshall;
pub(crate) mod mw;
pub(crate) mod ops;
pub(crate) mod parent;
pub(crate) mod pd_mr;
pub(crate) mod qp;
pub(crate) mod rates;
pub(crate) mod rsocket;
pub(crate) mod sockaddr;
pub(crate) mod srq;
pub(crate) mod strings;
pub(crate) mod wq;
pub(crate) mod wr;
pub(crate) mod xrc;

// Only the generated trampolines use these (not in the unit-test build).
#[allow(unused_imports)]
pub(crate) use self::{
    cm::*, control::*, cq::*, device::*, events::*, import::*, marshall::*, pd_mr::*, qp::*,
    rates::*, rsocket::*, srq::*, strings::*,
};
