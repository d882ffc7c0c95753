//! The emulated devices' kernel-facing files: a `class/infiniband` and
//! `class/infiniband_verbs` tree as the kernel's sysfs has them, for programs that read sysfs
//! besides calling verbs (UCX reads GID types and the NUMA node there, Open MPI's openib and
//! rdma-core's tests look the devices up there, through `ibv_get_sysfs_path()`).
//!
//! The tree is written from what the verbs report (the one source of truth) when the devices
//! are first listed, and a port's files again when its state changes. It goes into
//! `$RDMA_EMU_SYSFS` (which `rdma-emu run` sets, and mounts over `/sys/class` in the program's
//! own mount namespace), else into a directory of this process under the user's runtime
//! directory, removed at exit.

use std::{
    fmt::Write as _,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use rdma_emu::{Device, Gid, GidEntry, GidType, LinkLayer, PortState};

/// Where the tree is, once written: `(root, ours)`, `ours` when this process made the
/// directory and removes it at exit.
static ROOT: OnceLock<(PathBuf, bool)> = OnceLock::new();

/// The directory `ibv_get_sysfs_path()` names: `/sys` when `rdma-emu run` mounted the tree
/// there, else the tree's root.
pub(crate) fn sysfs_path() -> Option<PathBuf> {
    if std::env::var_os("RDMA_EMU_SYSFS_MOUNTED").is_some_and(|v| v == "1") {
        return Some(PathBuf::from("/sys"));
    }
    ROOT.get().map(|(p, _)| p.clone())
}

/// Writes the tree of `devices` (once per process) and keeps the ports' state files current.
pub(crate) fn publish(devices: &[Device]) {
    let Some(first) = devices.first() else { return };
    let mine = format!("sysfs-{}", std::process::id());
    let root = match std::env::var_os("RDMA_EMU_SYSFS").filter(|v| !v.is_empty()) {
        // The tree `rdma-emu run` made for the process it became is this one's to remove.
        Some(dir) => {
            let dir = PathBuf::from(dir);
            let ours = dir.file_name().is_some_and(|n| *n == *mine);
            (dir, ours)
        }
        None => match rdma_emu::private_dir(&mine) {
            Ok(dir) => (dir, true),
            Err(_) => return,
        },
    };
    if ROOT.set(root).is_err() {
        return;
    }
    let (root, ours) = ROOT.get().expect("set");
    if *ours && let Some(parent) = root.parent() {
        // Killed processes leave their trees: each new one takes a few away, so they never
        // pile up into a sweep that takes minutes.
        sweep(parent, Some(SWEEP_AT_START));
    }
    let _ = write_tree(root, devices);
    let root = root.clone();
    let _ = first.fabric().on_port_change(Box::new(move |d, port| {
        let _ = write_port_state(&root, d, port);
    }));
    if ROOT.get().is_some_and(|(_, ours)| *ours) {
        // SAFETY: registers a plain function with no captured state; it may run at exit.
        unsafe { libc::atexit(remove_at_exit) };
    }
}

/// Writes the tree of `devices` under `root` (`class/infiniband`, `class/infiniband_verbs`).
pub(crate) fn write_tree(root: &Path, devices: &[Device]) -> std::io::Result<()> {
    devices.iter().try_for_each(|d| write_device(root, d))
}

/// Trees of gone processes a process removes when it writes its own.
const SWEEP_AT_START: usize = 8;

/// Removes from `dir` the trees of processes that are gone (killed, or a program under
/// `rdma-emu run` that never loaded the library), at most `limit` of them.
pub(crate) fn sweep(dir: &Path, limit: Option<usize>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut left = limit.unwrap_or(usize::MAX);
    for e in entries.flatten() {
        if left == 0 {
            return;
        }
        let name = e.file_name();
        let pid: Option<libc::pid_t> =
            name.to_str().and_then(|n| n.strip_prefix("sysfs-")).and_then(|p| p.parse().ok());
        // SAFETY: kill with signal 0 only checks that the process exists.
        let gone = |pid| unsafe { libc::kill(pid, 0) } != 0;
        if let Some(pid) = pid
            && gone(pid)
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        {
            let _ = std::fs::remove_dir_all(e.path());
            left -= 1;
        }
    }
}

extern "C" fn remove_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        // Not by a child of `fork` that exits: the tree is its parent's.
        if let Some((root, true)) = ROOT.get()
            && root.file_name().is_some_and(|n| *n == *format!("sysfs-{}", std::process::id()))
        {
            let _ = std::fs::remove_dir_all(root);
        }
    });
}

fn put(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, format!("{text}\n"))
}

/// `0000:00ff:fe00:0001`: a GUID as sysfs prints it.
fn guid_text(guid: u64) -> String {
    let b = guid.to_be_bytes();
    let w = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
    format!("{:04x}:{:04x}:{:04x}:{:04x}", w(0), w(2), w(4), w(6))
}

/// `fe80:0000:...`: a GID as sysfs prints it (eight groups of four digits).
fn gid_text(g: &Gid) -> String {
    let mut s = String::new();
    for (i, pair) in g.0.chunks(2).enumerate() {
        let sep = if i == 0 { "" } else { ":" };
        let _ = write!(s, "{sep}{:02x}{:02x}", pair[0], pair[1]);
    }
    s
}

/// The kernel's `rate` text for a width and speed code.
fn rate_text(width: u8, speed: u8) -> String {
    let lanes = match width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        _ => 1,
    };
    let (gbps, name) = match speed {
        2 => (5.0, " DDR"),
        4 => (10.0, " QDR"),
        8 => (10.0, " FDR10"),
        16 => (14.0, " FDR"),
        32 => (25.0, " EDR"),
        64 => (50.0, " HDR"),
        128 => (100.0, " NDR"),
        _ => (2.5, " SDR"),
    };
    let total = gbps * lanes as f64;
    let total = if total.fract() == 0.0 { format!("{total:.0}") } else { format!("{total}") };
    format!("{total} Gb/sec ({lanes}X{name})")
}

/// The host's network interface holding `ip`, by name: the one with that address, else the
/// first whose subnet has it.
fn interface_of(ip: IpAddr) -> Option<String> {
    interface_where(ip, true).or_else(|| interface_where(ip, false))
}

fn interface_where(ip: IpAddr, exact: bool) -> Option<String> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = head;
    while !p.is_null() && found.is_none() {
        // SAFETY: a node of the list getifaddrs made, alive until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        // SAFETY: NULL or socket addresses of the node's family.
        let (Some(a), Some(m)) =
            (unsafe { sockaddr_ip(ifa.ifa_addr) }, unsafe { sockaddr_ip(ifa.ifa_netmask) })
        else {
            continue;
        };
        let inside = a == ip
            || !exact
                && match (a, m, ip) {
                    (IpAddr::V4(a), IpAddr::V4(m), IpAddr::V4(x)) => {
                        u32::from(a) & u32::from(m) == u32::from(x) & u32::from(m)
                    }
                    (IpAddr::V6(a), IpAddr::V6(m), IpAddr::V6(x)) => {
                        u128::from(a) & u128::from(m) == u128::from(x) & u128::from(m)
                    }
                    _ => false,
                };
        if inside {
            // SAFETY: a NUL-terminated interface name.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
            found = Some(name.to_string_lossy().into_owned());
        }
    }
    // SAFETY: the list getifaddrs made, not used after.
    unsafe { libc::freeifaddrs(head) };
    found
}

/// The IP address in a socket address of family AF_INET or AF_INET6.
///
/// # Safety
/// `sa` is NULL or points to a socket address of the size its family says.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    // SAFETY: NULL or a socket address (the caller's promise).
    let family = unsafe { sa.as_ref() }?.sa_family as i32;
    match family {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in.
            let raw = unsafe { (*sa.cast::<libc::sockaddr_in>()).sin_addr.s_addr };
            Some(IpAddr::from(std::net::Ipv4Addr::from(u32::from_be(raw))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it is a sockaddr_in6.
            let raw = unsafe { (*sa.cast::<libc::sockaddr_in6>()).sin6_addr.s6_addr };
            Some(IpAddr::from(raw))
        }
        _ => None,
    }
}

/// The IP address a RoCE GID stands for.
fn ip_of(g: &Gid) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(g.0);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// The network interface of a RoCE port of `d`: the one holding the first of its addresses
/// that an interface holds (GIDs from index 2 on), loopback's otherwise.
pub(crate) fn port_netdev(d: &Device, port: u8) -> String {
    let table = d.gid_table(port).unwrap_or_default();
    table
        .iter()
        .filter(|e| e.index >= 2)
        .find_map(|e| interface_of(ip_of(&e.gid)))
        .unwrap_or_else(|| "lo".into())
}

/// The netdev of GID `e` of a RoCE port whose interface is `port_dev`: for a GID of one of
/// the port's addresses (index 2 on) the interface holding it, else the port's own.
fn gid_netdev(e: &GidEntry, port_dev: &str) -> String {
    let held = (e.index >= 2).then(|| interface_of(ip_of(&e.gid))).flatten();
    held.unwrap_or_else(|| port_dev.to_string())
}

/// The interface index of the netdev of GID `g` of `port` of `d` (`ndev_ifindex`): on a
/// RoCE port the interface holding its address, or the port's; 0 on InfiniBand, as the kernel.
pub(crate) fn gid_ifindex(d: &Device, port: u8, e: &GidEntry) -> u32 {
    let roce = d.query_port(port).is_ok_and(|a| a.link_layer == LinkLayer::ETHERNET);
    if !roce {
        return 0;
    }
    ifindex(&gid_netdev(e, &port_netdev(d, port)))
}

/// The interface index of `name` (0 when there is none).
pub(crate) fn ifindex(name: &str) -> u32 {
    let Ok(c) = std::ffi::CString::new(name) else { return 0 };
    // SAFETY: a NUL-terminated name.
    unsafe { libc::if_nametoindex(c.as_ptr()) }
}

/// `local_cpus`: a mask of every configured CPU, in 32-bit groups as sysfs prints it.
fn cpu_mask() -> String {
    // SAFETY: sysconf takes no pointers.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
    let words = n.div_ceil(32);
    let word = |i: usize| -> u32 {
        let bits = n.saturating_sub(i * 32).min(32);
        if bits == 32 { u32::MAX } else { (1u32 << bits) - 1 }
    };
    (0..words).rev().map(|i| format!("{:08x}", word(i))).collect::<Vec<_>>().join(",")
}

fn write_device(root: &Path, d: &Device) -> std::io::Result<()> {
    let ib = root.join("class/infiniband").join(d.name());
    let a = d.attr();
    put(&ib.join("node_guid"), &guid_text(a.node_guid))?;
    put(&ib.join("sys_image_guid"), &guid_text(a.sys_image_guid))?;
    put(&ib.join("node_type"), "1: CA")?;
    put(&ib.join("node_desc"), &format!("rdma-emu {}", d.name()))?;
    put(&ib.join("fw_ver"), a.fw_ver)?;
    put(&ib.join("hw_rev"), &format!("0x{:x}", a.hw_ver))?;
    put(&ib.join("hca_type"), &format!("rdma-emu-{}", d.profile().name()))?;
    put(&ib.join("board_id"), "RDMA_EMU")?;
    put(&ib.join("device/numa_node"), "-1")?;
    put(&ib.join("device/local_cpus"), &cpu_mask())?;
    let ports = d.attr().phys_port_cnt;
    for port in 1..=ports {
        write_port(root, &ib, d, port)?;
    }
    let verbs = root.join("class/infiniband_verbs");
    put(&verbs.join("abi_version"), "6")?;
    let uverbs = verbs.join(format!("uverbs{}", d.index()));
    put(&uverbs.join("ibdev"), d.name())?;
    put(&uverbs.join("abi_version"), "1")?;
    put(&uverbs.join("dev"), &format!("231:{}", 192 + d.index()))
}

fn write_port(root: &Path, ib: &Path, d: &Device, port: u8) -> std::io::Result<()> {
    let p = ib.join(format!("ports/{port}"));
    let a = d.query_port(port).map_err(|e| std::io::Error::from_raw_os_error(e.errno().raw()))?;
    put(&p.join("lid"), &format!("0x{:x}", a.lid))?;
    put(&p.join("lid_mask_count"), &a.lmc.to_string())?;
    put(&p.join("sm_lid"), &format!("0x{:x}", a.sm_lid))?;
    put(&p.join("sm_sl"), &a.sm_sl.to_string())?;
    put(&p.join("cap_mask"), &format!("0x{:08x}", a.port_cap_flags))?;
    put(&p.join("rate"), &rate_text(a.active_width, a.active_speed))?;
    let roce = a.link_layer == LinkLayer::ETHERNET;
    put(&p.join("link_layer"), if roce { "Ethernet" } else { "InfiniBand" })?;
    put(&p.join("pkeys/0"), "0xffff")?;
    let netdev = roce.then(|| port_netdev(d, port));
    for e in d.gid_table(port).unwrap_or_default() {
        put(&p.join(format!("gids/{}", e.index)), &gid_text(&e.gid))?;
        let kind = if e.gid_type == GidType::ROCE_V2 { "RoCE v2" } else { "IB/RoCE v1" };
        put(&p.join(format!("gid_attrs/types/{}", e.index)), kind)?;
        if let Some(port_dev) = &netdev {
            put(&p.join(format!("gid_attrs/ndevs/{}", e.index)), &gid_netdev(&e, port_dev))?;
        }
    }
    if let Some(dev) = &netdev {
        let net = ib.join("device/net");
        std::fs::create_dir_all(&net)?;
        let link = net.join(dev);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("/sys/class/net").join(dev), &link)?;
        }
    }
    write_port_state(root, d, port)
}

/// A port's `state` and `phys_state`, as the kernel prints them.
fn write_port_state(root: &Path, d: &Device, port: u8) -> std::io::Result<()> {
    let p = root.join("class/infiniband").join(d.name()).join(format!("ports/{port}"));
    let a = d.query_port(port).map_err(|e| std::io::Error::from_raw_os_error(e.errno().raw()))?;
    let state = match a.state {
        PortState::ACTIVE => "4: ACTIVE",
        PortState::DOWN => "1: DOWN",
        PortState::INIT => "2: INIT",
        PortState::ARMED => "3: ARMED",
        _ => "0: NOP",
    };
    let phys = match a.phys_state {
        5 => "5: LinkUp",
        3 => "3: Disabled",
        2 => "2: Polling",
        _ => "1: Sleep",
    };
    put(&p.join("state"), state)?;
    put(&p.join("phys_state"), phys)
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn test_texts_are_the_kernels() {
        assert_eq!(guid_text(0x0000_00ff_fe00_0001), "0000:00ff:fe00:0001");
        let g = Gid::link_local(0x0000_00ff_fe00_0001);
        assert_eq!(gid_text(&g), "fe80:0000:0000:0000:0000:00ff:fe00:0001");
        assert_eq!(rate_text(2, 32), "100 Gb/sec (4X EDR)");
        assert_eq!(rate_text(1, 1), "2.5 Gb/sec (1X SDR)");
        assert_eq!(interface_of("127.0.0.1".parse().unwrap()).as_deref(), Some("lo"));
        assert_eq!(interface_of("127.0.0.2".parse().unwrap()).as_deref(), Some("lo"));
        assert!(!cpu_mask().is_empty() && cpu_mask().len().is_multiple_of(8));
    }
}
