//! The Vulkan server's own behaviour, on this machine's device (lavapipe in
//! CI), with the validation layer on: out-of-memory, a module the driver
//! rejects, capture replayed a thousand times, two streams, a large kernel
//! against a CPU reference, a failing chain, the staging path.

mod common;

use common::{add, bytes, copy, fill, step, words};
use scope_core::{Binding, Dispatch, Error, FaultPlan, Kernel, Site};
use scope_test::client_or_skip;

fn scalars(values: &[u32]) -> Vec<u8> {
    bytes(values)
}

fn groups(n: u32) -> Dispatch<'static> {
    Dispatch::linear(n.div_ceil(64))
}

/// 64 GiB is past what lavapipe could ever give one allocation (its heap
/// and `maxMemoryAllocationSize`): "never", an invalid argument with no
/// buffer, as on every server — not a buffer carrying out-of-memory, which
/// is what it was before the backend reported its real largest allocation.
/// The largest allocation itself is fine, and so is the device.
#[test]
fn an_allocation_past_the_device_is_an_invalid_argument_and_the_device_keeps_working() {
    let Some(client) = common::validating_or_skip() else {
        return;
    };
    let largest = client.with_backend(scope_core::Backend::max_allocation);
    if client.describe().contains("llvmpipe") {
        assert!(largest < 64 << 30, "lavapipe's largest is {largest}");
    }
    for size in [(64 << 30).max(largest + 4), largest + 4, u64::MAX] {
        assert!(
            matches!(
                client.try_allocate(size),
                Err(Error::InvalidArgument { .. })
            ),
            "{size}"
        );
        assert!(
            matches!(client.allocate(size), Err(Error::InvalidArgument { .. })),
            "{size}"
        );
    }
    assert_eq!(client.failures_held(), 0);
    // And the device still works.
    let out = client.try_allocate(256 * 4).unwrap();
    client
        .launch(
            &fill(),
            &[Binding::write(&out)],
            &scalars(&[256, 9]),
            groups(256),
        )
        .unwrap();
    assert_eq!(words(&client.read(&out).unwrap()), vec![9; 256]);
    assert!(client.poison().is_none());
}

/// SPIR-V the server can see is not a module — no entry point, no magic
/// number — is a compile error before any driver sees it. Garbage that
/// passes those checks would go to the driver, for which invalid SPIR-V is
/// undefined behaviour: building such a kernel is the caller's `unsafe`
/// promise (`Kernel::spirv`), which no test breaks.
#[test]
fn spirv_the_server_can_see_is_no_module_is_a_compile_error() {
    let Some(client) =
        client_or_skip(|| server_vulkan::client_with(server_vulkan::Config::default()))
    else {
        return;
    };
    let garbage = vec![
        0x0723_0203,
        0x0001_0000,
        0,
        1,
        0,
        0xdead_beef,
        0xdead_beef,
        0xdead_beef,
        0xdead_beef,
    ];
    // No entry point at all: refused before the driver sees it (the
    // driver would be handed a name the module does not have).
    // SAFETY: never reaches a driver — the server's own header check
    // refuses it (asserted below). A module that passed that check would be
    // handed to the driver, for which invalid SPIR-V is undefined behaviour:
    // that is the caller's promise (`Kernel::spirv`), so no test makes it.
    let garbage = unsafe { Kernel::spirv("garbage", garbage) };
    let error = client.compile(&garbage).expect_err("no entry point");
    assert!(
        matches!(&error, Error::Compile { log, .. } if log.contains("no entry point")),
        "{error}"
    );
    assert!(client.poison().is_none());
    // A module without the magic number never reaches the driver.
    // SAFETY: never reaches a driver: the server checks the magic number
    // first (asserted below).
    let not_spirv = unsafe { Kernel::spirv("not-spirv", vec![1, 2, 3]) };
    let error = client.compile(&not_spirv).expect_err("no magic");
    assert!(
        matches!(&error, Error::Compile { log, .. } if log.contains("magic")),
        "{error}"
    );
}

/// Host reference for `step`.
fn step_cpu(x: u32) -> u32 {
    x.wrapping_mul(3).wrapping_add(1)
}

#[test]
fn a_captured_window_replayed_a_thousand_times_gives_the_right_numbers() {
    let Some(client) = common::validating_or_skip() else {
        return;
    };
    let n = 1000u32;
    let x0: Vec<u32> = (0..n).collect();
    let x = client.upload(&bytes(&x0)).unwrap();
    let y = client.try_allocate(u64::from(n) * 4).unwrap();
    let z = client.try_allocate(u64::from(n) * 4).unwrap();
    let y_bytes: Vec<u32> = (0..n).map(|i| i * 7).collect();
    // Big enough (>64 KiB) that the window keeps it in a staging chunk
    // rather than in the command buffer.
    let big = client.try_allocate(128 << 10).unwrap();
    let big_words: Vec<u32> = (0..(32u32 << 10)).map(|i| i ^ 0xabcd).collect();

    let capture = client.begin_capture().unwrap();
    client.write(&y, &bytes(&y_bytes)).unwrap();
    client.write(&big, &bytes(&big_words)).unwrap();
    client
        .launch(
            &step(),
            &[Binding::read_write(&x)],
            &scalars(&[n]),
            groups(n),
        )
        .unwrap();
    client
        .launch(
            &add(),
            &[Binding::read(&x), Binding::read(&y), Binding::write(&z)],
            &scalars(&[n]),
            groups(n),
        )
        .unwrap();
    let graph = client.end_capture(capture).unwrap();
    // Nothing recorded has run.
    assert_eq!(words(&client.read(&x).unwrap()), x0);

    // The window's host write keeps the bytes given at call time.
    client.write(&y, &bytes(&vec![0; n as usize])).unwrap();
    for _ in 0..1000 {
        client.replay(&graph).unwrap();
    }
    let mut expect = x0.clone();
    for v in &mut expect {
        for _ in 0..1000 {
            *v = step_cpu(*v);
        }
    }
    let got_x = words(&client.read(&x).unwrap());
    assert_eq!(got_x, expect);
    let got_z = words(&client.read(&z).unwrap());
    let expect_z: Vec<u32> = expect
        .iter()
        .zip(&y_bytes)
        .map(|(a, b)| a.wrapping_add(*b))
        .collect();
    assert_eq!(got_z, expect_z);
    assert_eq!(words(&client.read(&y).unwrap()), y_bytes);
    assert_eq!(words(&client.read(&big).unwrap()), big_words);
    client.destroy_graph(&graph).unwrap();
}

#[test]
fn two_streams_order_through_shared_buffers_and_run_independently() {
    let Some(a) = common::validating_or_skip() else {
        return;
    };
    let b = a.new_stream().unwrap();
    let n = 4096u32;
    let shared = a.try_allocate(u64::from(n) * 4).unwrap();
    let out = b.try_allocate(u64::from(n) * 4).unwrap();
    let mine_a = a.try_allocate(u64::from(n) * 4).unwrap();
    let mine_b = b.try_allocate(u64::from(n) * 4).unwrap();
    for round in 0..50u32 {
        // Stream a writes `shared`; stream b must see it.
        a.launch(
            &fill(),
            &[Binding::write(&shared)],
            &scalars(&[n, round]),
            groups(n),
        )
        .unwrap();
        a.launch(
            &fill(),
            &[Binding::write(&mine_a)],
            &scalars(&[n, round + 1000]),
            groups(n),
        )
        .unwrap();
        b.launch(
            &fill(),
            &[Binding::write(&mine_b)],
            &scalars(&[n, round + 2000]),
            groups(n),
        )
        .unwrap();
        b.launch(
            &copy(),
            &[Binding::read(&shared), Binding::write(&out)],
            &scalars(&[n]),
            groups(n),
        )
        .unwrap();
        assert_eq!(
            words(&b.read(&out).unwrap()),
            vec![round; n as usize],
            "round {round}"
        );
    }
    a.sync().unwrap();
    b.sync().unwrap();
    assert_eq!(words(&a.read(&mine_a).unwrap()), vec![1049; n as usize]);
    assert_eq!(words(&b.read(&mine_b).unwrap()), vec![2049; n as usize]);
    // Two threads, one stream each, no shared buffer.
    let threads: Vec<_> = [
        (a.clone(), mine_a.clone(), 11u32),
        (b.clone(), mine_b.clone(), 22u32),
    ]
    .into_iter()
    .map(|(client, buffer, value)| {
        std::thread::spawn(move || {
            for i in 0..200u32 {
                client
                    .launch(
                        &fill(),
                        &[Binding::write(&buffer)],
                        &scalars(&[n, value + i]),
                        groups(n),
                    )
                    .unwrap();
            }
            words(&client.read(&buffer).unwrap())
        })
    })
    .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(results[0], vec![11 + 199; n as usize]);
    assert_eq!(results[1], vec![22 + 199; n as usize]);
}

#[test]
fn a_million_element_kernel_matches_the_cpu() {
    let Some(client) = common::validating_or_skip() else {
        return;
    };
    let n = 1u32 << 20;
    let a: Vec<u32> = (0..n).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let b: Vec<u32> = (0..n).map(|i| (i << 7) ^ 0xdead_beef).collect();
    let da = client.upload(&bytes(&a)).unwrap();
    let db = client.upload(&bytes(&b)).unwrap();
    let out = client.try_allocate(u64::from(n) * 4).unwrap();
    client
        .launch(
            &add(),
            &[Binding::read(&da), Binding::read(&db), Binding::write(&out)],
            &scalars(&[n]),
            groups(n),
        )
        .unwrap();
    let got = words(&client.read(&out).unwrap());
    let expect: Vec<u32> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
    assert_eq!(got.len(), expect.len());
    assert!(
        got == expect,
        "first mismatch at {:?}",
        got.iter().zip(&expect).position(|(g, e)| g != e)
    );
}

#[test]
fn a_failure_in_the_middle_of_a_chain_is_reported_with_the_chain() {
    let Some(client) = common::validating_or_skip() else {
        return;
    };
    let n = 256u32;
    let size = u64::from(n) * 4;
    let [a, b, c, d, e] = [(); 5].map(|()| client.try_allocate(size).unwrap());
    client
        .launch(&fill(), &[Binding::write(&a)], &scalars(&[n, 1]), groups(n))
        .unwrap();
    // The second launch from here on fails as the device would.
    client.inject(FaultPlan::new().fail(
        Site::Launch,
        2,
        Error::Launch {
            kernel: "copy".into(),
            stream: client.stream(),
            detail: "injected in the middle of the chain".into(),
        },
    ));
    client
        .launch(
            &copy(),
            &[Binding::read(&a), Binding::write(&b)],
            &scalars(&[n]),
            groups(n),
        )
        .unwrap();
    let failed = client
        .launch(
            &copy(),
            &[Binding::read(&b), Binding::write(&c)],
            &scalars(&[n]),
            groups(n),
        )
        .expect_err("injected");
    assert!(matches!(failed, Error::Launch { .. }), "{failed}");
    let skipped = client
        .launch(
            &add(),
            &[Binding::read(&c), Binding::read(&a), Binding::write(&d)],
            &scalars(&[n]),
            groups(n),
        )
        .expect_err("skipped");
    assert!(matches!(skipped, Error::Skipped { .. }), "{skipped}");
    client
        .launch(
            &copy(),
            &[Binding::read(&d), Binding::write(&e)],
            &scalars(&[n]),
            groups(n),
        )
        .expect_err("skipped");
    // The work before the failure ran.
    assert_eq!(words(&client.read(&b).unwrap()), vec![1; n as usize]);
    let report = client.read(&e).expect_err("e carries the failure");
    let entry = &report.unwritten()[0];
    assert!(
        matches!(&*entry.root, Error::Launch { detail, .. } if detail.contains("middle")),
        "{report}"
    );
    let hops: Vec<&str> = entry.chain.hops.iter().map(|h| &*h.kernel).collect();
    assert_eq!(hops, ["copy", "add"], "{report}");
    assert_eq!(entry.chain.hops[1].needed.buffer, c.id());
    let text = report.to_string();
    assert!(
        text.contains("skipped `add`") && text.contains("middle"),
        "{text}"
    );
    // A rewrite of c heals the path.
    client
        .launch(
            &copy(),
            &[Binding::read(&b), Binding::write(&c)],
            &scalars(&[n]),
            groups(n),
        )
        .unwrap();
    assert_eq!(words(&client.read(&c).unwrap()), vec![1; n as usize]);
}

#[test]
fn the_staging_path_writes_reads_and_copies() {
    let Some(client) = common::validating_staged_or_skip() else {
        return;
    };
    let n = 50_000u32; // 200 KB: a staged write, not an inline one
    let data: Vec<u32> = (0..n).map(|i| i.wrapping_mul(31)).collect();
    let src = client.upload(&bytes(&data)).unwrap();
    let dst = client.try_allocate(u64::from(n) * 4).unwrap();
    client.copy(&src, &dst).unwrap();
    assert_eq!(words(&client.read(&dst).unwrap()), data);
    client
        .write(dst.slice(16..32), &bytes(&[1, 2, 3, 4]))
        .unwrap();
    assert_eq!(
        words(&client.read(dst.slice(8..40)).unwrap()),
        [data[2], data[3], 1, 2, 3, 4, data[8], data[9]]
    );
    let out = client.try_allocate(u64::from(n) * 4).unwrap();
    client
        .launch(
            &add(),
            &[
                Binding::read(&src),
                Binding::read(&src),
                Binding::write(&out),
            ],
            &scalars(&[n]),
            groups(n),
        )
        .unwrap();
    let expect: Vec<u32> = data.iter().map(|v| v.wrapping_mul(2)).collect();
    assert_eq!(words(&client.read(&out).unwrap()), expect);
}

/// A staged read past one arena chunk (256 KiB) stages into a chunk of its
/// own size, which is not kept as a spare once its submission completes.
/// The read copies out of it after that submission, so recycling must
/// leave it mapped until then (the stream reclaims right after it submits
/// and may already see the copy done). Repeated, each read after a write
/// to the same buffer, which it must see.
#[test]
fn a_staged_read_larger_than_a_chunk() {
    let Some(client) = common::validating_staged_or_skip() else {
        return;
    };
    let n = 300_000u32; // 1.2 MB: past a 256 KiB chunk
    let data: Vec<u32> = (0..n).map(|i| i ^ 0x5a5a).collect();
    let buf = client.upload(&bytes(&data)).unwrap();
    for round in 0..8u32 {
        client
            .write(buf.slice(0..8), &bytes(&[round, round + 1]))
            .unwrap();
        let read = words(&client.read(&buf).unwrap());
        assert_eq!(read[..2], [round, round + 1]);
        assert_eq!(read[2..], data[2..]);
    }
}

#[test]
fn freed_memory_is_reused_and_blocks_are_pooled() {
    let Some(client) = common::validating_or_skip() else {
        return;
    };
    let first = client.try_allocate(1 << 20).unwrap();
    let reserved = client.bytes_reserved();
    assert!(reserved >= 1 << 20);
    // Many small allocations share the block.
    let small: Vec<_> = (0..32)
        .map(|_| client.try_allocate(4096).unwrap())
        .collect();
    assert_eq!(client.bytes_reserved(), reserved);
    drop(small);
    for round in 0..100u32 {
        let b = client.try_allocate(1 << 20).unwrap();
        client
            .launch(
                &fill(),
                &[Binding::write(&b)],
                &scalars(&[1 << 18, round]),
                groups(1 << 18),
            )
            .unwrap();
        if round % 10 == 0 {
            client.sync().unwrap();
        }
    }
    client.sync().unwrap();
    assert_eq!(
        client.bytes_reserved(),
        reserved,
        "a freed range was not reused"
    );
    drop(first);
}

/// A launch the device's limits refuse is the caller's mistake: an invalid
/// argument from `check_launch`, before the scope opens, so it claims
/// nothing and fires no hook — as the core's own checks, and as wgpu.
#[test]
fn a_launch_past_the_device_limits_is_an_invalid_argument_that_claims_nothing() {
    let Some(client) = common::validating_or_skip() else {
        return;
    };
    let out = client.upload(&bytes(&[6; 64])).unwrap();
    let held = client.failures_held();
    let seen = client.failures_seen();
    let refused = |r: scope_core::Result<()>, text: &str| match r {
        Err(Error::InvalidArgument { what, why }) => assert!(
            what.contains("`fill`") && why.contains(text),
            "{what}: {why}"
        ),
        other => panic!("expected an invalid argument about {text:?}, got {other:?}"),
    };
    // `fill` declares out and the scalar blob; no scalars given.
    refused(
        client.launch(&fill(), &[Binding::write(&out)], &[], Dispatch::linear(1)),
        "declares 2 storage buffers",
    );
    let max = client.with_backend(|b| b.max_workgroups());
    refused(
        client.launch(
            &fill(),
            &[Binding::write(&out)],
            &scalars(&[64, 1]),
            Dispatch::Groups([max[0] + 1, 1, 1]),
        ),
        // The core's grid check, against `maxComputeWorkGroupCount`.
        &format!("workgroups along axis 0 is past the device's {}", max[0]),
    );
    let range = client.with_backend(|b| b.max_storage_buffer_range());
    let big = client.try_allocate(range + 256).unwrap();
    refused(
        client.launch(
            &fill(),
            &[Binding::write(&big)],
            &scalars(&[64, 1]),
            Dispatch::linear(1),
        ),
        "maxStorageBufferRange",
    );
    assert_eq!(client.failures_held(), held, "nothing claimed");
    assert_eq!(client.failures_seen(), seen, "no failure seen");
    assert_eq!(words(&client.read(&out).unwrap()), vec![6; 64]);
    assert!(client.read(big.slice(0..256)).is_ok());
}

#[test]
fn spirv_from_naga_runs_like_the_wgsl_it_came_from() {
    let Some(client) = common::validating_or_skip() else {
        return;
    };
    let module = naga::front::wgsl::parse_str(common::FILL).unwrap();
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .unwrap();
    let words_spv = naga::back::spv::write_vec(
        &module,
        &info,
        &naga::back::spv::Options::default(),
        Some(&naga::back::spv::PipelineOptions {
            shader_stage: naga::ShaderStage::Compute,
            entry_point: "main".into(),
        }),
    )
    .unwrap();
    // SAFETY: naga's own output for a WGSL kernel it validated, lowered
    // with its bounds checks (the WGSL above guards every access with `n`,
    // which the launch below sets to the binding's length).
    let kernel = unsafe { Kernel::spirv("fill-spv", words_spv) };
    let out = client.try_allocate(100 * 4).unwrap();
    client
        .launch(
            &kernel,
            &[Binding::write(&out)],
            &scalars(&[100, 77]),
            groups(100),
        )
        .unwrap();
    assert_eq!(words(&client.read(&out).unwrap()), vec![77; 100]);
}

#[test]
fn probe_lists_the_devices() {
    let probe = server_vulkan::probe();
    if !probe.has_device() {
        println!("skipped: no vulkan device ({:?})", probe.why_not);
        assert!(!scope_test::required("vulkan"));
        return;
    }
    for device in &probe.devices {
        assert!(!device.name.is_empty());
        if device.name.contains("llvmpipe") {
            assert_eq!(device.kind, scope_core::DeviceKind::Software);
        }
    }
}

/// Provoke one validation error through the raw device: a zero-sized buffer
/// (VUID-VkBufferCreateInfo-size-00912).
fn provoke_validation_error(client: &scope_core::Client<server_vulkan::Vulkan>) {
    client.with_backend(|b| {
        let raw = b.raw().expect("the device is open");
        let info = ash::vk::BufferCreateInfo::default()
            .size(0)
            .usage(ash::vk::BufferUsageFlags::STORAGE_BUFFER);
        // SAFETY: an invalid create info on purpose; lavapipe tolerates a
        // zero size and the buffer is destroyed at once.
        unsafe {
            if let Ok(buffer) = raw.device.create_buffer(&info, None) {
                raw.device.destroy_buffer(buffer, None);
            }
        }
    });
}

/// The layer is really listening, and a message really fails a test: the
/// backend panics when dropped with messages unread.
#[test]
fn a_validation_message_is_collected_and_fails_the_test() {
    let Some(client) = common::validating_or_skip() else {
        return;
    };
    assert!(client.with_backend(|b| b.validating()));
    provoke_validation_error(&client);
    let messages = client.with_backend(|b| b.validation_messages());
    assert!(messages.iter().any(|m| m.contains("00912")), "{messages:?}");
    // Drained: this client drops cleanly. Another one, not drained, panics.
    let unread = common::validating().unwrap();
    provoke_validation_error(&unread);
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(unread)));
    assert!(
        dropped.is_err(),
        "dropping with unread validation messages must fail the test"
    );
}
