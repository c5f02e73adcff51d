//! The runtime's logic on the reference host server, whose kernels here are
//! the CPU reference itself: the forward pass, the fault act's chain and
//! recovery, capture/replay and the data-parallel step on four host
//! servers are checked on every CI run, device or not.

mod common;

use scope_core::{Client, Kernel};
use scope_test::host::{Host, HostArgs};
use tiny_runtime::demo::{self, TOLERANCE};
use tiny_runtime::{Kernels, Mlp, Runtime, Shape, Weights, mlp};

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn store(out: &mut [u8], values: &[f32]) {
    for (chunk, v) in out.chunks_exact_mut(4).zip(values) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
}

fn host_runtime() -> Runtime<Host> {
    host_runtime_on(Host::new())
}

/// The runtime on `host`, its kernels registered.
fn host_runtime_on(mut host: Host) -> Runtime<Host> {
    host.register("matmul", |args: &mut HostArgs<'_>| {
        let (m, n, k) = (
            args.scalar_u32(0) as usize,
            args.scalar_u32(1) as usize,
            args.scalar_u32(2) as usize,
        );
        let c = mlp::matmul(
            &floats(&args.bindings[0]),
            &floats(&args.bindings[1]),
            m,
            k,
            n,
        );
        store(&mut args.bindings[2], &c);
        Ok(())
    });
    host.register("bias_add", |args: &mut HostArgs<'_>| {
        let cols = args.scalar_u32(1) as usize;
        let bias = floats(&args.bindings[1]);
        let out: Vec<f32> = floats(&args.bindings[0])
            .iter()
            .enumerate()
            .map(|(i, v)| v + bias[i % cols])
            .collect();
        store(&mut args.bindings[2], &out);
        Ok(())
    });
    host.register("gelu", |args: &mut HostArgs<'_>| {
        let out: Vec<f32> = floats(&args.bindings[0])
            .into_iter()
            .map(mlp::gelu)
            .collect();
        store(&mut args.bindings[1], &out);
        Ok(())
    });
    host.register("softmax", |args: &mut HostArgs<'_>| {
        let cols = args.scalar_u32(1) as usize;
        let out: Vec<f32> = floats(&args.bindings[0])
            .chunks_exact(cols)
            .flat_map(mlp::softmax)
            .collect();
        store(&mut args.bindings[1], &out);
        Ok(())
    });
    host.register("transpose", |args: &mut HostArgs<'_>| {
        let (rows, cols) = (args.scalar_u32(0) as usize, args.scalar_u32(1) as usize);
        let x = floats(&args.bindings[0]);
        let mut out = vec![0.0; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                out[c * rows + r] = x[r * cols + c];
            }
        }
        store(&mut args.bindings[1], &out);
        Ok(())
    });
    host.register("gelu_grad", |args: &mut HostArgs<'_>| {
        let out: Vec<f32> = floats(&args.bindings[0])
            .into_iter()
            .zip(floats(&args.bindings[1]))
            .map(|(x, dy)| dy * mlp::gelu_grad(x))
            .collect();
        store(&mut args.bindings[2], &out);
        Ok(())
    });
    host.register("loss_grad", |args: &mut HostArgs<'_>| {
        let rows = args.scalar_u32(1) as f32;
        let out: Vec<f32> = floats(&args.bindings[0])
            .into_iter()
            .zip(floats(&args.bindings[1]))
            .map(|(p, t)| (p - t) / rows)
            .collect();
        store(&mut args.bindings[2], &out);
        Ok(())
    });
    host.register("sgd", |args: &mut HostArgs<'_>| {
        let lr = floats(&args.bindings[2])[0];
        let out: Vec<f32> = floats(&args.bindings[0])
            .into_iter()
            .zip(floats(&args.bindings[1]))
            .map(|(w, g)| w - lr * g)
            .collect();
        store(&mut args.bindings[3], &out);
        Ok(())
    });
    // The device kernels' rounding: to nearest even, two values a word, low first.
    host.register("to_bf16", |args: &mut HostArgs<'_>| {
        let len = args.scalar_u32(0) as usize;
        let x = floats(&args.bindings[0]);
        let bits = |v: f32| {
            let b = v.to_bits();
            b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16
        };
        let words = args.bindings[1].chunks_exact_mut(4).take(len.div_ceil(2));
        for (i, word) in words.enumerate() {
            let hi = if 2 * i + 1 < len {
                bits(x[2 * i + 1])
            } else {
                0
            };
            word.copy_from_slice(&(bits(x[2 * i]) | hi << 16).to_le_bytes());
        }
        Ok(())
    });
    host.register("from_bf16", |args: &mut HostArgs<'_>| {
        let len = args.scalar_u32(0) as usize;
        let words: Vec<u32> = args.bindings[0]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let out: Vec<f32> = (0..len)
            .map(|i| {
                let word = words[i / 2];
                f32::from_bits(if i % 2 == 1 {
                    word & 0xffff_0000
                } else {
                    word << 16
                })
            })
            .collect();
        store(&mut args.bindings[1], &out);
        Ok(())
    });
    let kernels = Kernels {
        matmul: Kernel::host("matmul"),
        bias_add: Kernel::host("bias_add"),
        gelu: Kernel::host("gelu"),
        softmax: Kernel::host("softmax"),
        transpose: Kernel::host("transpose"),
        gelu_grad: Kernel::host("gelu_grad"),
        loss_grad: Kernel::host("loss_grad"),
        sgd: Kernel::host("sgd"),
        to_bf16: Kernel::host("to_bf16"),
        from_bf16: Kernel::host("from_bf16"),
    };
    Runtime::with_kernels(Client::new(host).expect("host server"), kernels)
}

#[test]
fn forward_matches_the_reference() {
    let rt = host_runtime();
    let weights = Weights::random(Shape::TEST, 1);
    let setup = demo::setup(&rt, &weights, 2).unwrap();
    let fwd = demo::forward(&rt, &setup.mlp, &setup.reference).unwrap();
    assert!(fwd.max_error <= TOLERANCE, "max error {}", fwd.max_error);
    // Probabilities: each row sums to one.
    let probs = rt.read(&setup.mlp.probs).unwrap();
    for row in probs.chunks_exact(Shape::TEST.output) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    }
}

#[test]
fn a_fault_in_the_first_matmul_reads_as_its_chain_and_heals() {
    let rt = host_runtime();
    let weights = Weights::random(Shape::TEST, 3);
    let setup = demo::setup(&rt, &weights, 4).unwrap();
    demo::forward(&rt, &setup.mlp, &setup.reference).unwrap();
    let fault = demo::fault(&rt, &setup.mlp, &setup.x, &setup.reference).unwrap();
    println!("what the user sees:\n{}", fault.read_error);
    let expected: Vec<&str> = Mlp::KERNELS[1..].iter().rev().copied().collect();
    assert_eq!(fault.skipped, expected, "{}", fault.read_error);
    assert!(
        fault.root.contains("INJECTED_LAUNCH_FAILURE"),
        "{}",
        fault.root
    );
    assert!(fault.read_error.to_string().contains("layer2.softmax"));
    assert!(!fault.poisoned);
    assert!(fault.device_kept_working);
    assert!(
        fault.rerun_max_error <= TOLERANCE,
        "{}",
        fault.rerun_max_error
    );
    assert_eq!(
        rt.client().failures_held(),
        0,
        "a healed pass leaves no failure held"
    );
}

#[test]
fn a_captured_pass_replays_to_the_reference() {
    let rt = host_runtime();
    let weights = Weights::random(Shape::TEST, 5);
    let setup = demo::setup(&rt, &weights, 6).unwrap();
    demo::forward(&rt, &setup.mlp, &setup.reference).unwrap();
    let replay = demo::replay(&rt, &setup.mlp, &setup.reference, 3).unwrap();
    assert_eq!(replay.passes, 3);
    assert!(replay.max_error <= TOLERANCE, "{}", replay.max_error);
}

/// One step with `bf16` gradients on four host servers: half the bytes
/// through the all-reduce, the same bits on every rank, and within the
/// documented bound of the CPU's `f32` step, though not within `f32`'s own
/// tolerance (so the gradients did travel in `bf16`).
#[test]
fn a_bf16_step_on_four_host_devices_is_within_its_bound() {
    let shape = common::data_parallel_shape(4);
    let f32_step = || (0..4).map(|_| host_runtime()).collect::<Vec<_>>();
    let step = demo::bf16_step(f32_step(), (shape, demo::LEARNING_RATE, 45)).unwrap();
    println!(
        "bf16: gradient error {:.2e} (bound {:.2e}), weights error {:.2e} (bound {:.2e})",
        step.check.gradient_error,
        step.gradient_bound,
        step.check.weights_error,
        step.weights_bound
    );
    assert!(step.passed(), "{step:#?}");
    assert!(
        step.check.gradient_error > TOLERANCE / 100.0,
        "a bf16 gradient as close as f32's: {}",
        step.check.gradient_error
    );
    let dp = tiny_runtime::data_parallel::DataParallel::new(
        f32_step(),
        &tiny_runtime::Weights::random(shape, 45),
        demo::LEARNING_RATE,
    )
    .unwrap();
    assert!(
        step.bytes <= dp.gradient_bytes() / 2 + 4,
        "{} bytes in bf16 for {} in f32",
        step.bytes,
        dp.gradient_bytes()
    );
}

/// Act four on four host servers: a clean data-parallel step agreeing with
/// the CPU's on the whole batch, a fault in rank 2's backward pass failing
/// every rank's gradient and no rank's weights, and the next step clean.
#[test]
fn a_data_parallel_step_on_four_host_devices() {
    let runtimes: Vec<_> = (0..4).map(|_| host_runtime()).collect();
    let report = demo::data_parallel(
        runtimes,
        (common::data_parallel_shape(4), demo::LEARNING_RATE, 41),
        &demo::inject_loss,
    )
    .unwrap();
    assert_eq!(report.faulted_rank, 2);
    common::assert_data_parallel(&report);
}

/// Act four where the lost rank's device cannot open again in this
/// process, as after CUDA's process-fatal faults (which HIP follows): its
/// recovery answers `Error::RestartRequired`, it stays out of the group,
/// and the survivors go on, their steps the CPU's over their rows.
#[test]
fn a_rank_whose_device_cannot_reopen_stays_out_and_the_survivors_go_on() {
    let runtimes: Vec<_> = (0..4)
        .map(|replica| {
            let host = Host::new();
            // Replica 2 is the one act four loses.
            host_runtime_on(if replica == 2 {
                host.cannot_reopen()
            } else {
                host
            })
        })
        .collect();
    let report = demo::data_parallel(
        runtimes,
        (common::data_parallel_shape(4), demo::LEARNING_RATE, 43),
        &demo::inject_loss,
    )
    .unwrap();
    assert_eq!(report.faulted_rank, 2);
    common::assert_data_parallel_without_the_lost_rank(&report, |why| {
        matches!(why, scope_core::Error::RestartRequired { .. })
    });
}

/// The CPU reference's gradient is the gradient: a central difference of
/// the loss along one weight of each tensor agrees with it.
#[test]
fn the_reference_gradient_matches_finite_differences() {
    use tiny_runtime::data_parallel::{reference_step, targets};
    let shape = Shape {
        batch: 6,
        input: 5,
        hidden: 4,
        output: 3,
    };
    let weights = Weights::random(shape, 51);
    let x = weights.input(52);
    let t = targets(shape, 53);
    let step = reference_step(&weights, &x, &t, 0.1);
    let loss_at = |w: &Weights| reference_step(w, &x, &t, 0.0).loss;
    let h = 1e-3f32;
    type Pick = fn(&mut Weights) -> &mut Vec<f32>;
    let picks: [(&str, Pick, usize); 4] = [
        ("w1", |w| &mut w.w1, 7),
        ("b1", |w| &mut w.b1, 2),
        ("w2", |w| &mut w.w2, 5),
        ("b2", |w| &mut w.b2, 1),
    ];
    for (name, pick, i) in picks {
        let (mut up, mut down) = (weights.clone(), weights.clone());
        pick(&mut up)[i] += h;
        pick(&mut down)[i] -= h;
        let numeric = (loss_at(&up) - loss_at(&down)) / (2.0 * f64::from(h));
        let analytic = f64::from(pick(&mut step.gradient.clone())[i]);
        assert!(
            (numeric - analytic).abs() < 1e-3,
            "{name}[{i}]: finite difference {numeric}, gradient {analytic}"
        );
    }
}

#[test]
fn a_rejected_launch_is_returned_not_carried() {
    let rt = host_runtime();
    let a = rt.empty(2, 3).unwrap();
    let b = rt.empty(4, 5).unwrap();
    let c = rt.empty(2, 5).unwrap();
    let error = rt.matmul("bad", &a, &b, &c).unwrap_err();
    assert!(error.to_string().contains("matmul rhs"), "{error}");
}

#[test]
fn the_reference_matmul_is_a_matmul() {
    // [[1,2],[3,4]] · [[5,6],[7,8]] = [[19,22],[43,50]]
    let c = mlp::matmul(&[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0], 2, 2, 2);
    assert_eq!(c, vec![19.0, 22.0, 43.0, 50.0]);
    let s = mlp::softmax(&[0.0, 0.0]);
    assert_eq!(s, vec![0.5, 0.5]);
    assert!((mlp::gelu(1.0) - 0.841_192).abs() < 1e-5);
}

#[test]
fn the_cube_path_needs_a_target() {
    let client = Client::new(scope_test::host::Host::new()).expect("host server");
    let Err(error) = Runtime::new(client) else {
        panic!("a cube runtime on the host server, which takes no compiled language");
    };
    assert!(
        matches!(error, scope_core::Error::InvalidArgument { .. }),
        "{error}"
    );
}

/// The cube kernels translate for every target, and the compiler's own
/// access analysis agrees with what the runtime binds: inputs read,
/// outputs only written (a kernel that read its output would be skipped
/// after a failure instead of healing it).
#[test]
fn the_cube_kernels_translate_for_every_target_with_write_only_outputs() {
    use scope_core::Access;
    use scope_cube::Target;
    for target in Target::ALL {
        let k = tiny_runtime::CubeKernels::for_target(target)
            .unwrap_or_else(|e| panic!("{target:?}: {e}"));
        for (name, kernel, access) in [
            (
                "matmul",
                &k.matmul,
                &[Access::Read, Access::Read, Access::Write][..],
            ),
            (
                "bias_add",
                &k.bias_add,
                &[Access::Read, Access::Read, Access::Write][..],
            ),
            ("gelu", &k.gelu, &[Access::Read, Access::Write][..]),
            ("softmax", &k.softmax, &[Access::Read, Access::Write][..]),
            (
                "transpose",
                &k.transpose,
                &[Access::Read, Access::Write][..],
            ),
            (
                "gelu_grad",
                &k.gelu_grad,
                &[Access::Read, Access::Read, Access::Write][..],
            ),
            (
                "loss_grad",
                &k.loss_grad,
                &[Access::Read, Access::Read, Access::Write][..],
            ),
            (
                "sgd",
                &k.sgd,
                &[Access::Read, Access::Read, Access::Read, Access::Write][..],
            ),
        ] {
            assert_eq!(kernel.target(), target);
            assert_eq!(kernel.name().as_ref(), name);
            assert_eq!(kernel.source().language(), target.language());
            let got: Vec<Access> = (0..kernel.buffers())
                .map(|i| kernel.access(i).unwrap())
                .collect();
            assert_eq!(got, access, "{target:?} {name}");
            let scalars: usize = kernel.scalars().iter().map(|(_, n)| n).sum();
            assert_eq!(scalars, if name == "matmul" { 3 } else { 2 }, "{name}");
        }
    }
}
