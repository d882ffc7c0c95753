//! Socket addresses between C and Rust (`struct sockaddr_in` / `sockaddr_in6`), for the CM's
//! calls and the rsocket calls alike.

use core::ffi::c_int;
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    ptr,
};

/// `a` as C spells it, in a zeroed `sockaddr_storage`, and the length of that form.
pub(crate) fn to_c(a: SocketAddr) -> (libc::sockaddr_storage, usize) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let at = ptr::from_mut(&mut storage);
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_storage (128 bytes, 8-aligned) holds a sockaddr_in.
            unsafe { at.cast::<libc::sockaddr_in>().write(sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: v6.ip().octets() },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: a sockaddr_storage holds a sockaddr_in6.
            unsafe { at.cast::<libc::sockaddr_in6>().write(sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len)
}

/// The IPv4 or IPv6 address at `p`. With `len`, the caller said how many bytes are there
/// (`EINVAL` when too few for the family); without, there are as many as the family needs.
/// `EFAULT` for NULL, `EAFNOSUPPORT` for another family.
///
/// # Safety
/// `p` is NULL or readable for `len` bytes (without `len`: for its family's address).
pub(crate) unsafe fn from_c(
    p: *const libc::sockaddr,
    len: Option<usize>,
) -> Result<SocketAddr, c_int> {
    if p.is_null() {
        return Err(libc::EFAULT);
    }
    if len.is_some_and(|l| l < size_of::<libc::sa_family_t>()) {
        return Err(libc::EINVAL);
    }
    let fits = |need: usize| len.is_none_or(|l| l >= need);
    // SAFETY: readable for at least the family, by the caller's contract.
    let family = c_int::from(unsafe { ptr::read_unaligned(ptr::addr_of!((*p).sa_family)) });
    match family {
        libc::AF_INET if fits(size_of::<libc::sockaddr_in>()) => {
            // SAFETY: long enough for a sockaddr_in; read unaligned as C may put it anywhere.
            let a = unsafe { ptr::read_unaligned(p.cast::<libc::sockaddr_in>()) };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Ok(SocketAddr::new(IpAddr::V4(ip), u16::from_be(a.sin_port)))
        }
        libc::AF_INET6 if fits(size_of::<libc::sockaddr_in6>()) => {
            // SAFETY: long enough for a sockaddr_in6.
            let a = unsafe { ptr::read_unaligned(p.cast::<libc::sockaddr_in6>()) };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Ok(SocketAddr::new(IpAddr::V6(ip), u16::from_be(a.sin6_port)))
        }
        libc::AF_INET | libc::AF_INET6 => Err(libc::EINVAL),
        _ => Err(libc::EAFNOSUPPORT),
    }
}
