//! Devices, ports, PDs, MRs, CQs and QP modify validation.

mod common;
use common::*;
use rdma_emu::*;

/// What rxe reports.
#[test]
fn rxe_profile_reports_what_rxe_reports() {
    let f = Fabric::new(FabricConfig { devices: 1, profile: Profile::Rxe, ..Default::default() });
    let d = &f.devices()[0];
    assert_eq!(d.name(), "emu0");
    let a = d.attr();
    assert_eq!(
        (a.max_qp, a.max_qp_wr, a.max_cq, a.max_cqe, a.max_mr, a.max_pd),
        (1_048_560, 1_048_576, 1_048_576, 32_767, 524_287, 1_048_576)
    );
    assert_eq!(
        (a.max_sge, a.max_sge_rd, a.max_srq_sge, a.max_ah, a.max_mw),
        (32, 32, 27, 32_767, 524_287)
    );
    assert_eq!((a.max_qp_rd_atom, a.max_qp_init_rd_atom, a.max_res_rd_atom), (128, 128, 258_048));
    assert_eq!(
        (a.max_mcast_grp, a.max_mcast_qp_attach, a.max_pkeys, a.local_ca_ack_delay),
        (8192, 56, 64, 15)
    );
    assert_eq!(
        (a.device_cap_flags, a.atomic_cap, a.vendor_id),
        (0x0122_3c76, AtomicCap::HCA, 0xff_ffff)
    );
    assert_eq!(a.max_mr_size, u64::MAX);
    let p = d.query_port(1).unwrap();
    assert_eq!(
        (p.state, p.max_mtu, p.active_mtu),
        (PortState::ACTIVE, Mtu::MTU_4096, Mtu::MTU_1024)
    );
    assert_eq!((p.gid_tbl_len, p.pkey_tbl_len, p.max_msg_sz, p.lid), (1024, 1, 0x80_0000, 0));
    assert_eq!(p.link_layer, LinkLayer::ETHERNET);
    // GID 0: link-local from the MAC's EUI-64; GID 1: the IPv4-mapped address; both RoCE v2.
    let g0 = d.query_gid_entry(1, 0).unwrap().unwrap();
    let g1 = d.query_gid_entry(1, 1).unwrap().unwrap();
    assert_eq!(g0.gid_type, GidType::ROCE_V2);
    assert_eq!(&g0.gid.0[..8], &[0xfe, 0x80, 0, 0, 0, 0, 0, 0]);
    assert_eq!(g0.gid.interface_id(), d.guid());
    assert_eq!(&g1.gid.0[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
    // Then the GIDs of the port's IP addresses (loopback's at least), then empty entries.
    let table = d.gid_table(1).unwrap();
    let lo = Gid::of_ip(std::net::Ipv4Addr::LOCALHOST.into());
    assert!(table.iter().any(|e| e.gid == lo && e.index >= 2), "{table:?}");
    let past = table.len() as u32;
    assert_eq!(d.query_gid_entry(1, past).unwrap(), None, "an empty entry");
    assert_eq!(d.query_gid(1, past).unwrap(), Gid::ZERO);
    assert_eq!(d.query_gid(1, 1024).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(d.query_pkey(1, 0).unwrap(), 0xffff);
    assert_eq!(d.query_pkey(1, 1).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(d.query_port(2).unwrap_err().errno(), Errno::EINVAL);
}

#[test]
fn full_profile_uses_infiniband_lids_and_unique_guids() {
    let f = Fabric::new(FabricConfig { devices: 3, profile: Profile::Full, ..Default::default() });
    let devs = f.devices();
    let lids: Vec<u16> = devs.iter().map(|d| d.query_port(1).unwrap().lid).collect();
    assert_eq!(lids, vec![1, 2, 3]);
    assert_eq!(devs[0].query_port(1).unwrap().link_layer, LinkLayer::INFINIBAND);
    assert_ne!(devs[0].guid(), devs[1].guid());
    assert_eq!(f.device("emu2").unwrap().index(), 2);
    assert_eq!(devs[0].query_gid_entry(1, 0).unwrap().unwrap().gid_type, GidType::IB);
}

#[test]
fn pd_in_use_cannot_be_deallocated_and_destroyed_objects_refuse_use() {
    let f = Fabric::new(FabricConfig::default());
    let ctx = f.devices()[0].open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(pd.dealloc().unwrap_err().errno(), Errno::EBUSY);
    mr.dereg().unwrap();
    assert_eq!(mr.dereg().unwrap_err().errno(), Errno::EINVAL, "double dereg");
    pd.dealloc().unwrap();
    assert_eq!(pd.dealloc().unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(pd.reg_mr(64, AccessFlags::empty()).unwrap_err().errno(), Errno::EINVAL);
}

#[test]
fn mr_access_flags_are_validated_like_the_kernel() {
    let f = Fabric::new(FabricConfig::default());
    let pd = f.devices()[0].open().unwrap().alloc_pd().unwrap();
    for bad in [AccessFlags::REMOTE_WRITE, AccessFlags::REMOTE_ATOMIC] {
        assert_eq!(pd.reg_mr(64, bad).unwrap_err().errno(), Errno::EINVAL, "{bad:?}");
    }
    // On-demand paging is the full profile's (as mlx5), not rxe's (Linux 6.1).
    let odp = AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND;
    let mr = pd.reg_mr(64, odp).unwrap();
    assert!(format!("{mr:?}").contains("KeyTable"), "an MR prints without recursing");
    let rxe = Fabric::new(FabricConfig { profile: Profile::Rxe, ..Default::default() });
    let rxe_pd = rxe.devices()[0].open().unwrap().alloc_pd().unwrap();
    assert_eq!(rxe_pd.reg_mr(64, odp).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(
        pd.reg_mr(64, AccessFlags::from_bits_retain(1 << 12)).unwrap_err().errno(),
        Errno::EINVAL
    );
    assert_eq!(pd.reg_mr(0, AccessFlags::LOCAL_WRITE).unwrap_err().errno(), Errno::EINVAL);
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).unwrap();
    assert_eq!(mr.rkey(), mr.lkey());
    assert_eq!(
        mr.write(60, &[0; 5]).unwrap_err().errno(),
        Errno::EINVAL,
        "local access is bounded"
    );
}

#[test]
fn keys_of_a_freed_slot_never_name_the_new_mr() {
    let f = Fabric::new(FabricConfig::default());
    let pd = f.devices()[0].open().unwrap().alloc_pd().unwrap();
    let a = pd.reg_mr(64, ALL_ACCESS).unwrap();
    let old = a.lkey();
    a.dereg().unwrap();
    let b = pd.reg_mr(64, ALL_ACCESS).unwrap();
    assert_eq!(b.lkey() >> 8, old >> 8, "the slot is reused");
    assert_ne!(b.lkey(), old, "with a new key byte");
}

#[test]
fn rereg_changes_access_and_pd_in_full_and_is_eopnotsupp_in_rxe() {
    let (_f, a, b) = pair(Profile::Full);
    let target = b.pd.reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).unwrap();
    let src = [sge(&a.mr, 0, 8)];
    let rkey = target.rkey();
    target.rereg(Rereg::access(ALL_ACCESS)).unwrap();
    assert_eq!(target.rkey(), rkey, "the rkey saved at registration stays valid");
    assert_eq!(target.access(), ALL_ACCESS);
    a.qp.post_send(&SendWr::write(1, &src, target.addr(), target.rkey()).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS, "the new access right is in force");
    let other = b.ctx.alloc_pd().unwrap();
    target.rereg(Rereg::pd(&other)).unwrap();
    assert!(target.pd().same(&other));
    a.qp.post_send(&SendWr::write(2, &src, target.addr(), target.rkey())).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR, "now in a PD the QP is not in");

    let f = Fabric::new(FabricConfig { devices: 1, profile: Profile::Rxe, ..Default::default() });
    let pd = f.devices()[0].open().unwrap().alloc_pd().unwrap();
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(mr.rereg(Rereg::access(ALL_ACCESS)).unwrap_err().errno(), Errno::EOPNOTSUPP);
}

#[test]
fn the_active_mtu_of_roce_ports_follows_the_netdev_mtu() {
    // rxe keeps 80 bytes for headers, mlx5 96: the largest IB MTU that fits what is left.
    let cases = [
        (Profile::Rxe, 1500, Mtu::MTU_1024),
        (Profile::Rxe, 9000, Mtu::MTU_4096),
        (Profile::Rxe, 4176, Mtu::MTU_4096),
        (Profile::Rxe, 4175, Mtu::MTU_2048),
        (Profile::Rxe, 576, Mtu::MTU_256),
        (Profile::Full, 4191, Mtu::MTU_2048),
        (Profile::Full, 4192, Mtu::MTU_4096),
    ];
    for (profile, netdev_mtu, active) in cases {
        let cfg = FabricConfig {
            devices: 1,
            profile,
            link_layer: LinkLayer::ETHERNET,
            netdev_mtu: Some(netdev_mtu),
            ..Default::default()
        };
        let port = Fabric::new(cfg).devices()[0].open().unwrap().query_port(1).unwrap();
        assert_eq!((port.active_mtu, port.max_mtu), (active, Mtu::MTU_4096), "{netdev_mtu}");
    }
    // InfiniBand ports have no netdev: the subnet's MTU stays.
    let cfg = FabricConfig { devices: 1, netdev_mtu: Some(1500), ..Default::default() };
    let port = Fabric::new(cfg).devices()[0].open().unwrap().query_port(1).unwrap();
    assert_eq!(port.active_mtu, Mtu::MTU_4096);
    let vars = |v: &'static str| move |k: &str| (k == "RDMA_EMU_MTU").then(|| v.to_owned());
    assert_eq!(FabricConfig::try_from_vars(vars("9000")).unwrap().netdev_mtu, Some(9000));
    assert!(FabricConfig::try_from_vars(vars("9k")).is_err(), "a malformed MTU is an error");
}

#[test]
fn the_full_profile_rkey_is_the_lkey_whatever_the_access_and_rxe_gives_local_mrs_none() {
    for (profile, rkey_of_local) in [(Profile::Full, true), (Profile::Rxe, false)] {
        let f = Fabric::new(FabricConfig { devices: 1, profile, ..Default::default() });
        let pd = f.devices()[0].open().unwrap().alloc_pd().unwrap();
        let local = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let remote = pd.reg_mr(64, ALL_ACCESS).unwrap();
        let expect = if rkey_of_local { local.lkey() } else { 0 };
        assert_eq!(local.rkey(), expect, "{profile:?}");
        assert_eq!(remote.rkey(), remote.lkey(), "{profile:?}");
    }
}

#[test]
fn rereg_moves_an_mr_to_new_memory_under_the_same_keys() {
    let (_f, a, b) = pair(Profile::Full);
    let mut first = vec![0u64; 8];
    let mut second = vec![0u64; 16];
    // SAFETY: both buffers outlive the MR, deregistered before they are dropped.
    let raw = unsafe { RawMemory::new(first.as_mut_ptr().cast(), 64) };
    let mr = b.pd.reg_mr_raw(raw, 0x1000, ALL_ACCESS).unwrap();
    let (lkey, rkey) = (mr.lkey(), mr.rkey());
    // SAFETY: as above.
    let raw = unsafe { RawMemory::new(second.as_mut_ptr().cast(), 128) };
    mr.rereg(Rereg { translation: Some((raw, 0x8000)), ..Rereg::default() }).unwrap();
    assert_eq!((mr.lkey(), mr.rkey(), mr.addr(), mr.length()), (lkey, rkey, 0x8000, 128));
    a.mr.write_u64(0, 0xfeed).unwrap();
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], 0x8000 + 120, rkey).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    a.qp.post_send(&SendWr::write(2, &[sge(&a.mr, 0, 8)], 0x1000, rkey).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::REM_ACCESS_ERR, "the old iova is gone");
    assert_eq!(mr.rereg(Rereg::default()).unwrap_err().errno(), Errno::EINVAL, "no change");
    mr.dereg().unwrap();
    assert_eq!((second[15], first.iter().sum::<u64>()), (0xfeed, 0));
}

#[test]
fn zero_based_mrs_count_from_zero_on_the_full_profile_and_rxe_ignores_the_flag() {
    for profile in [Profile::Full, Profile::Rxe] {
        let f = Fabric::new(FabricConfig { devices: 1, profile, ..Default::default() });
        let pd = f.devices()[0].open().unwrap().alloc_pd().unwrap();
        let mut buf = vec![0u64; 8];
        let host = buf.as_mut_ptr() as u64;
        // SAFETY: `buf` outlives the MR, deregistered below.
        let raw = unsafe { RawMemory::new(buf.as_mut_ptr().cast(), 64) };
        let mr = pd.reg_mr_raw(raw, host, ALL_ACCESS | AccessFlags::ZERO_BASED).unwrap();
        let want = if profile == Profile::Full { 0 } else { host };
        assert_eq!(mr.addr(), want, "{profile:?}");
        mr.dereg().unwrap();
    }
}

#[test]
fn registering_memory_that_cannot_be_pinned_is_efault() {
    let f = Fabric::new(FabricConfig::default());
    let pd = f.devices()[0].open().unwrap().alloc_pd().unwrap();
    // SAFETY: the registrations below fail, so nothing ever touches these addresses.
    let wild = unsafe { RawMemory::new(0x10 as *mut u8, 64) };
    assert_eq!(pd.reg_mr_raw(wild, 0x10, ALL_ACCESS).unwrap_err().errno(), Errno::EFAULT);
    let text = registering_memory_that_cannot_be_pinned_is_efault as *const u8 as *mut u8;
    // SAFETY: code pages are mapped read-only for the whole run; a read-only MR only reads.
    let code = unsafe { RawMemory::new(text, 64) };
    assert_eq!(
        pd.reg_mr_raw(code, text as u64, AccessFlags::LOCAL_WRITE).unwrap_err().errno(),
        Errno::EFAULT,
        "read-only memory with a writable right"
    );
    // SAFETY: as above.
    let code = unsafe { RawMemory::new(text, 64) };
    let mr = pd.reg_mr_raw(code, text as u64, AccessFlags::REMOTE_READ).unwrap();
    assert_eq!(
        mr.rereg(Rereg::access(AccessFlags::LOCAL_WRITE)).unwrap_err().errno(),
        Errno::EFAULT,
        "nor can rereg make it writable"
    );
    mr.dereg().unwrap();
}

#[test]
fn raw_memory_registration_reads_and_writes_the_callers_buffer() {
    let (_f, a, b) = pair(Profile::Full);
    let mut buf = vec![0u64; 8];
    // SAFETY: `buf` outlives the MR: it is deregistered before `buf` is dropped below.
    let raw = unsafe { RawMemory::new(buf.as_mut_ptr().cast(), 64) };
    let iova = 0x1000_0000;
    let mr = b.pd.reg_mr_raw(raw, iova, ALL_ACCESS).unwrap();
    assert_eq!(mr.addr(), iova, "SGEs and peers use the iova");
    a.mr.write_u64(0, 0x1122_3344_5566_7788).unwrap();
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], iova + 16, mr.rkey()).signaled())
        .unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    mr.dereg().unwrap();
    assert_eq!(buf[2], 0x1122_3344_5566_7788);
}

#[test]
fn dmabuf_registration_maps_the_file_and_peers_write_into_it() {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    // SAFETY: memfd_create takes a NUL-terminated name; a non-negative result is our fd.
    let fd = unsafe { libc::memfd_create(c"emu-dmabuf".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: just created, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let file = std::fs::File::from(fd.try_clone().unwrap());
    file.set_len(2 * 4096).unwrap();
    let (_f, a, b) = pair(Profile::Full);
    let mr = b.pd.reg_dmabuf_mr(fd.as_fd(), 4096 + 8, 64, 0x9008, ALL_ACCESS).unwrap();
    drop(fd); // the MR keeps its own mapping
    a.mr.write_u64(0, 0x0102_0304_0506_0708).unwrap();
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 8)], 0x9008 + 16, mr.rkey()).signaled())
        .unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let mut word = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut word, 4096 + 8 + 16).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 0x0102_0304_0506_0708);
    let einval = |off, len, iova| b.pd.reg_dmabuf_mr(file.as_fd(), off, len, iova, ALL_ACCESS);
    assert_eq!(einval(0, 8, 8).unwrap_err().errno(), Errno::EINVAL, "page offsets differ");
    assert_eq!(einval(4096, 4097, 4096).unwrap_err().errno(), Errno::EINVAL, "past the end");
    mr.dereg().unwrap();
    let (_f, _a, rxe) = pair(Profile::Rxe);
    let refused = rxe.pd.reg_dmabuf_mr(file.as_fd(), 0, 8, 0, ALL_ACCESS).unwrap_err();
    assert_eq!(refused.errno(), Errno::EOPNOTSUPP);
}

#[test]
fn on_demand_paging_takes_unmapped_memory_and_faults_pages_in_when_used() {
    let (_f, a, b) = pair(Profile::Full);
    let odp = ALL_ACCESS | AccessFlags::ON_DEMAND;
    // A range reserved without access (PROT_NONE, so no other thread's mapping can land in it
    // while the test runs): nothing there can be pinned or touched yet.
    // SAFETY: a private anonymous mapping of our own.
    let mem = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        p.cast::<u8>()
    };
    // SAFETY: an on-demand MR promises nothing mapped: the emulator checks each access.
    let raw = || unsafe { RawMemory::new(mem, 4096) };
    assert_eq!(b.pd.reg_mr_raw(raw(), mem as u64, ALL_ACCESS).unwrap_err().errno(), Errno::EFAULT);
    let mr = b.pd.reg_mr_raw(raw(), mem as u64, odp).unwrap();
    let write = |id| {
        a.qp.post_send(
            &SendWr::write(id, &[sge(&a.mr, 0, 8)], mem as u64 + 8, mr.rkey()).signaled(),
        )
        .unwrap();
        wait1(&a.cq).status
    };
    let prefetch = |flush| b.pd.advise_mr(Advice::PREFETCH_WRITE, flush, &[sge(&mr, 0, 4096)]);
    assert_eq!(prefetch(true).unwrap_err().errno(), Errno::EFAULT);
    assert!(prefetch(false).is_ok(), "an asynchronous prefetch reports nothing");
    a.mr.write_u64(0, 0x0dd).unwrap();
    assert_eq!(write(1), WcStatus::REM_ACCESS_ERR, "no page to fault in");
    // SAFETY: our reservation, replaced by usable memory (MAP_FIXED over our own mapping).
    let again = unsafe {
        libc::mmap(
            mem.cast(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(again, mem.cast());
    prefetch(true).unwrap();
    let (_f, a, b2) = pair(Profile::Full);
    let mr = b2.pd.reg_mr_raw(raw(), mem as u64, odp).unwrap();
    a.mr.write_u64(0, 0x0dd).unwrap();
    a.qp.post_send(&SendWr::write(2, &[sge(&a.mr, 0, 8)], mem as u64 + 8, mr.rkey()).signaled())
        .unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    assert_eq!(mr.read_u64(8).unwrap(), 0x0dd);
    mr.dereg().unwrap();
    // Implicit ODP: any address through one rkey.
    let all = b2.pd.reg_mr_implicit_odp(odp).unwrap();
    assert_eq!((all.addr(), all.length()), (0, usize::MAX));
    let target = Box::new(0u64);
    let at = &*target as *const u64 as u64;
    a.qp.post_send(&SendWr::write(3, &[sge(&a.mr, 0, 8)], at, all.rkey()).signaled()).unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    // SAFETY: the emulator's write has completed; nothing else touches the box.
    assert_eq!(unsafe { std::ptr::read_volatile(at as *const u64) }, 0x0dd);
    all.dereg().unwrap();
    // SAFETY: our own mapping, no MR over it any more.
    unsafe { libc::munmap(mem.cast(), 4096) };
    let (_f, _a, rxe) = pair(Profile::Rxe);
    assert_eq!(rxe.pd.reg_mr_implicit_odp(odp).unwrap_err().errno(), Errno::EINVAL);
}

#[test]
fn cq_sizes_limits_and_resize() {
    let f = Fabric::new(FabricConfig { devices: 1, profile: Profile::Rxe, ..Default::default() });
    let ctx = f.devices()[0].open().unwrap();
    assert_eq!(ctx.create_cq(0, None, 0).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(ctx.create_cq(32_768, None, 0).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(
        ctx.create_cq(4, None, 2).unwrap_err().errno(),
        Errno::EINVAL,
        "2 completion vectors"
    );
    let cq = ctx.create_cq(10, None, 1).unwrap();
    assert_eq!(cq.cqe(), 15);
    assert_eq!(cq.resize(100).unwrap(), 127);
    assert_eq!(cq.resize(0).unwrap_err().errno(), Errno::EINVAL);
}

#[test]
fn resize_below_the_queued_count_is_refused() {
    let (_f, a, b) = pair(Profile::Full);
    for i in 0..5 {
        a.qp.post_send(&SendWr::write(i, &[sge(&a.mr, 0, 8)], b.mr.addr(), b.mr.rkey()).signaled())
            .unwrap();
    }
    assert_eq!(a.cq.resize(3).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(a.cq.resize(7).unwrap(), 7);
    assert_eq!(wait_n(&a.cq, 5).len(), 5);
}

#[test]
fn cq_and_pd_used_by_a_qp_are_busy_until_it_is_destroyed() {
    let (_f, a, _b) = pair(Profile::Full);
    assert_eq!(a.cq.destroy().unwrap_err().errno(), Errno::EBUSY);
    a.qp.destroy().unwrap();
    assert_eq!(a.qp.destroy().unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(a.qp.query().unwrap_err().errno(), Errno::EINVAL);
    a.cq.destroy().unwrap();
    a.mr.dereg().unwrap();
    a.pd.dealloc().unwrap();
}

#[test]
fn create_qp_validates_caps_and_types() {
    let f = Fabric::new(FabricConfig { devices: 1, profile: Profile::Rxe, ..Default::default() });
    let ctx = f.devices()[0].open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None, 0).unwrap();
    let mk = |qp_type, cap| {
        pd.create_qp(&QpInitAttr {
            qp_type,
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            sq_sig_all: false,
            srq: None,
            max_tso_header: 0,
            create_flags: QpCreateFlags::empty(),
        })
    };
    let ok = common::cap(8);
    for bad in [
        QpCap { max_send_wr: 1_048_577, ..ok },
        QpCap { max_recv_wr: 1_048_577, ..ok },
        QpCap { max_send_sge: 33, ..ok },
        QpCap { max_recv_sge: 33, ..ok },
        QpCap { max_inline_data: 513, ..ok },
    ] {
        assert_eq!(mk(QpType::RC, bad).unwrap_err().errno(), Errno::EINVAL, "{bad:?}");
    }
    assert_eq!(mk(QpType::XRC_SEND, ok).unwrap_err().errno(), Errno::EOPNOTSUPP);
    assert_eq!(mk(QpType(77), ok).unwrap_err().errno(), Errno::EINVAL);
    // The kernel passes a driver QP to the device, which rxe refuses (recorded on rxe).
    assert_eq!(mk(QpType::DRIVER, ok).unwrap_err().errno(), Errno::EOPNOTSUPP);
    let qp = mk(QpType::RC, QpCap { max_send_sge: 2, max_inline_data: 100, ..ok }).unwrap();
    assert_eq!(qp.cap().max_send_sge, 6, "rxe sizes the WQE for max(sge * 16, inline)");
    assert_eq!(qp.cap().max_inline_data, 100);
    assert!(qp.qp_num() >= 0x11);
    let other = mk(QpType::RC, ok).unwrap();
    assert_ne!(qp.qp_num(), other.qp_num());
}

#[test]
fn modify_checks_transitions_masks_and_values() {
    use QpAttrMask as M;
    let f = Fabric::new(FabricConfig { devices: 2, profile: Profile::Rxe, ..Default::default() });
    let n = node_on(&f.devices()[0], 64);
    let peer = node_on(&f.devices()[1], 64);
    let einval = |r: Result<()>| assert_eq!(r.unwrap_err().errno(), Errno::EINVAL);
    let to = |s| QpAttr { qp_state: s, port_num: 1, ..Default::default() };
    einval(n.qp.modify(&to(QpState::RTR), M::STATE));
    einval(n.qp.modify(&to(QpState::ERR), M::STATE));
    einval(n.qp.modify(&to(QpState::INIT), M::STATE | M::PORT));
    einval(n.qp.modify(
        &QpAttr { port_num: 2, ..to(QpState::INIT) },
        M::STATE | M::PORT | M::PKEY_INDEX | M::ACCESS_FLAGS,
    ));
    einval(n.qp.modify(
        &QpAttr { pkey_index: 1, ..to(QpState::INIT) },
        M::STATE | M::PORT | M::PKEY_INDEX | M::ACCESS_FLAGS,
    ));
    einval(n.qp.modify(&QpAttr { qp_state: QpState(9), ..to(QpState::INIT) }, M::STATE));
    n.qp.modify(&to(QpState::INIT), M::STATE | M::PORT | M::PKEY_INDEX | M::ACCESS_FLAGS).unwrap();
    assert_eq!(n.qp.query().unwrap().path_mtu, Mtu::MTU_256, "rxe starts a QP's path MTU at 256");
    assert!(n.qp.query().unwrap().ah_attr.is_global, "rxe reads every address vector as global");
    let ep = peer.qp.endpoint(0);
    let rtr = QpAttr {
        qp_state: QpState::RTR,
        path_mtu: Mtu::MTU_1024,
        dest_qp_num: ep.qpn,
        ah_attr: AhAttr { is_global: true, dgid: ep.gid, port_num: 1, ..Default::default() },
        max_dest_rd_atomic: 1,
        ..Default::default()
    };
    let m = RC_RTR_MASK;
    einval(n.qp.modify(&QpAttr { path_mtu: Mtu(6), ..rtr }, m));
    einval(n.qp.modify(&QpAttr { ah_attr: AhAttr { is_global: false, ..rtr.ah_attr }, ..rtr }, m));
    assert_eq!(
        n.qp.modify(&QpAttr { ah_attr: AhAttr { sgid_index: 250, ..rtr.ah_attr }, ..rtr }, m)
            .unwrap_err()
            .errno(),
        Errno::ENODATA,
        "an empty GID entry"
    );
    assert_eq!(n.qp.modify(&rtr, m | M::RATE_LIMIT).unwrap_err().errno(), Errno::EOPNOTSUPP);
    einval(n.qp.modify(&rtr, m | M::ALT_PATH));
    einval(n.qp.modify(&QpAttr { max_dest_rd_atomic: 129, ..rtr }, m));
    // The kernel refuses an address vector's invalid port (0 among them) for every device.
    einval(n.qp.modify(&QpAttr { ah_attr: AhAttr { port_num: 0, ..rtr.ah_attr }, ..rtr }, m));
    let ah_attr = AhAttr { sl: 5, static_rate: 3, ..rtr.ah_attr };
    n.qp.modify(&QpAttr { ah_attr, ..rtr }, m).unwrap();
    let av = n.qp.query().unwrap().ah_attr;
    assert_eq!((av.sl, av.static_rate), (0, 0), "rxe's address vector keeps neither");
    let rts = QpAttr {
        qp_state: QpState::RTS,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..Default::default()
    };
    let m = M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
    einval(n.qp.modify(&QpAttr { max_rd_atomic: 129, ..rts }, m));
    einval(n.qp.modify(&QpAttr { timeout: 32, ..rts }, m));
    n.qp.modify(&QpAttr { sq_psn: 0x1ff_ffff, ..rts }, m).unwrap();
    let q = n.qp.query().unwrap();
    assert_eq!(
        (q.qp_state, q.sq_psn, q.dest_qp_num, q.path_mtu),
        (QpState::RTS, 0xff_ffff, ep.qpn, Mtu::MTU_1024)
    );
    // CUR_STATE must match the real state, and is allowed in RTS.
    einval(n.qp.modify(&QpAttr { cur_qp_state: QpState::RTR, ..q }, M::CUR_STATE));
    n.qp.modify(&q, M::CUR_STATE).unwrap();
    // To SQD and back; to RESET clears the QP.
    n.qp.modify(&to(QpState::SQD), M::STATE).unwrap();
    n.qp.modify(&to(QpState::RTS), M::STATE).unwrap();
    n.qp.modify(&to(QpState::RESET), M::STATE).unwrap();
    assert_eq!(n.qp.state(), QpState::RESET);
}

#[test]
fn several_ports_per_device_route_by_lid_and_gid() {
    let f = Fabric::new(FabricConfig { ports: 2, ..Default::default() });
    let devs = f.devices();
    assert_eq!(devs[0].attr().phys_port_cnt, 2);
    let lids: Vec<u16> =
        devs.iter().flat_map(|d| (1..=2).map(move |p| d.query_port(p).unwrap().lid)).collect();
    assert_eq!(lids, vec![1, 2, 3, 4], "LIDs are unique on the fabric");
    assert_ne!(devs[0].query_gid(1, 0).unwrap(), devs[0].query_gid(2, 0).unwrap());
    assert_eq!(devs[0].query_port(3).unwrap_err().errno(), Errno::EINVAL);

    // Port 2 of device 0 to port 2 of device 1, and loopback port 1 -> port 2 of device 0.
    let a = node_on(&devs[0], 4096);
    let b = node_on(&devs[1], 4096);
    let c = node_on(&devs[0], 4096);
    let p2 = RcParams { port_num: 2, ..Default::default() };
    let p1 = RcParams::default();
    a.qp.connect(1, &b.qp.endpoint_on(2, 2).unwrap(), &p2).unwrap();
    b.qp.connect(2, &a.qp.endpoint_on(2, 1).unwrap(), &p2).unwrap();
    a.mr.write(0, b"port2").unwrap();
    a.qp.post_send(&SendWr::write(1, &[sge(&a.mr, 0, 5)], b.mr.addr(), b.mr.rkey()).signaled())
        .unwrap();
    assert_eq!(wait1(&a.cq).status, WcStatus::SUCCESS);
    let mut got = [0u8; 5];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"port2");
    post_recv(&b.qp, 7, &[sge(&b.mr, 100, 16)]);
    a.qp.post_send(&SendWr::send(2, &[sge(&a.mr, 0, 5)])).unwrap();
    assert_eq!(wait1(&b.cq).slid, 2, "slid is the sending port's LID");

    // A peer that addresses the wrong port of C's device never reaches C.
    let d = node_on(&devs[1], 4096);
    let pd = RcParams { timeout: 1, retry_cnt: 1, ..Default::default() };
    d.qp.connect(3, &c.qp.endpoint_on(2, 4).unwrap(), &pd).unwrap();
    c.qp.connect(4, &d.qp.endpoint(3), &p1).unwrap(); // C is on port 1
    d.qp.post_send(&SendWr::write(3, &[sge(&d.mr, 0, 4)], c.mr.addr(), c.mr.rkey())).unwrap();
    assert_eq!(wait1(&d.cq).status, WcStatus::RETRY_EXC_ERR);
}

#[test]
fn infiniband_routes_by_lid_even_when_a_grh_names_another_port() {
    let f = Fabric::new(FabricConfig { ports: 2, ..Default::default() });
    let devs = f.devices();
    let (a, b) = (node_on(&devs[0], 4096), node_on(&devs[1], 4096));
    let (qa, qb) = (ud_qp(&a, 5, 4), ud_qp(&b, 5, 4)); // both on port 1; b's LID is 3
    let gid = devs[1].query_gid(1, 0).unwrap();
    let to = |dlid| {
        let attr = AhAttr { is_global: true, dgid: gid, dlid, port_num: 1, ..Default::default() };
        a.pd.create_ah(&attr).unwrap()
    };
    post_recv(&qb, 1, &[sge(&b.mr, 0, 128)]);
    // The GRH names b's port 1, the DLID its port 2: the subnet delivers to port 2.
    qa.post_send(&SendWr::send_ud(1, &[sge(&a.mr, 0, 8)], &to(4), qb.qp_num(), 5)).unwrap();
    qa.post_send(&SendWr::send_ud(2, &[sge(&a.mr, 0, 4)], &to(3), qb.qp_num(), 5)).unwrap();
    assert_eq!(wait_n(&a.cq, 2).len(), 2);
    let r = wait1(&b.cq);
    assert_eq!(r.byte_len, 40 + 4, "only the datagram to port 1's LID arrived");
}

#[test]
fn address_vector_port_must_be_the_qps_port() {
    let f = Fabric::new(FabricConfig { ports: 2, ..Default::default() });
    let devs = f.devices();
    let a = node_on(&devs[0], 64);
    let b = node_on(&devs[1], 64);
    let mut ep = b.qp.endpoint(0);
    ep.lid = 3;
    let init = QpAttr { qp_state: QpState::INIT, port_num: 1, ..Default::default() };
    use QpAttrMask as M;
    a.qp.modify(&init, M::STATE | M::PORT | M::PKEY_INDEX | M::ACCESS_FLAGS).unwrap();
    let rtr = QpAttr {
        qp_state: QpState::RTR,
        path_mtu: Mtu::MTU_1024,
        dest_qp_num: ep.qpn,
        ah_attr: AhAttr { dlid: ep.lid, port_num: 2, ..Default::default() },
        ..Default::default()
    };
    let m = RC_RTR_MASK;
    assert_eq!(a.qp.modify(&rtr, m).unwrap_err().errno(), Errno::EINVAL);
    a.qp.modify(&QpAttr { ah_attr: AhAttr { port_num: 1, ..rtr.ah_attr }, ..rtr }, m).unwrap();
}

#[test]
fn ece_options_are_asked_for_and_taken_up_at_the_connecting_transitions() {
    use QpAttrMask as M;
    let (_f, a, _b) = pair(Profile::Full);
    let vendor = a.ctx.query_device().vendor_id;
    let qp = new_qp(&a.pd, &a.cq, QpType::RC, 4, false);
    let offered = Ece { vendor_id: vendor, options: 0x3, comp_mask: 0 };
    assert_eq!(qp.query_ece().unwrap(), offered, "a new QP reports what the device offers");
    let err = |e: Ece| qp.set_ece(&e).unwrap_err().errno();
    assert_eq!(err(Ece { vendor_id: 0, options: 1, comp_mask: 0 }), Errno::EOPNOTSUPP);
    assert_eq!(err(Ece { vendor_id: 0x02c9, options: 1, comp_mask: 0 }), Errno::EINVAL);
    assert_eq!(err(Ece { comp_mask: 1, ..offered }), Errno::EINVAL);
    qp.set_ece(&Ece { options: 0x5, ..offered }).unwrap();
    assert_eq!(qp.query_ece().unwrap().options, 0, "nothing in force until a transition");
    let init = QpAttr { qp_state: QpState::INIT, port_num: 1, ..Default::default() };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS).unwrap();
    assert_eq!(qp.query_ece().unwrap().options, 0x1, "what was asked, as far as offered");
    // rxe has no ECE.
    let (_f, r, _rb) = pair(Profile::Rxe);
    assert_eq!(r.qp.query_ece().unwrap_err().errno(), Errno::EOPNOTSUPP);
    let rxe_ece = Ece { vendor_id: r.ctx.query_device().vendor_id, options: 1, comp_mask: 0 };
    assert_eq!(r.qp.set_ece(&rxe_ece).unwrap_err().errno(), Errno::EOPNOTSUPP);
}
