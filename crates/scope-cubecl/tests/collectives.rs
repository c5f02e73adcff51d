//! cubecl-core's `collectives`, `all_reduce` and `to_client` runtime tests,
//! on four logical devices of one adapter, for the wgpu and the Vulkan
//! server.
//!
//! Before the first device is listed, the adapter is split into four
//! (`scope_cubecl::split_into_logical_devices`, what
//! `SCOPE_LOGICAL_DEVICES=4` does), each device opening a scope server of
//! its own, and every scope server moves bytes between them through
//! `scope_core::collective`. cubecl's tests return early, passing, when
//! there are too few devices or no transport, so each one here is wrapped:
//! the adapter's per-device counts (`scope_cubecl::communication_counts`)
//! before and after show how many devices took part, and a test that moved
//! nothing between at least two devices fails — or, where there is no
//! device, says `not exercised: …`. The tests take turns (one lock), so
//! each one's counts are its own.
//!
//! The wgpu device is the one `SCOPE_WGPU_BACKEND`/`SCOPE_WGPU_ADAPTER`
//! choose (lavapipe through Vulkan, llvmpipe through GL), the Vulkan one
//! the one `SCOPE_VULKAN_DEVICE` chooses.

use std::sync::Mutex;

use cubecl_common::device::{Device, DeviceId};
use cubecl_core::ir::{ElemType, FloatKind, IntKind, UIntKind};
use cubecl_runtime::client::{ClientGroup, MemberBuffers};
use cubecl_runtime::runtime::Runtime;
use cubecl_runtime::server::ReduceOperation;
use scope_cubecl::{
    CommunicationCounts, CubeBackend, ScopeRuntime, communication_counts,
    split_into_logical_devices,
};

const DEVICES: u16 = 4;

/// One test at a time, so each test's counts are its own.
static SERIAL: Mutex<()> = Mutex::new(());

fn counts() -> Vec<CommunicationCounts> {
    (0..DEVICES).map(communication_counts).collect()
}

/// Run `test` on `B`'s four logical devices, and check it moved bytes
/// between at least `devices` of them.
fn run<B: CubeBackend>(name: &str, devices: usize, test: fn()) {
    split_into_logical_devices(DEVICES)
        .unwrap_or_else(|decided| panic!("the device count was decided already: {decided:?}"));
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let probe = B::probe();
    if !probe.has_device() {
        println!("not exercised: no {} device", B::RUNTIME_NAME);
        return;
    }
    let listed = ScopeRuntime::<B>::enumerate_devices(0).len();
    assert_eq!(listed, usize::from(DEVICES), "logical devices listed");

    let before = counts();
    test();
    let after = counts();

    let mut parts = 0;
    let mut transfers = 0;
    let mut sent = 0;
    let mut took_part = Vec::new();
    for (index, (before, after)) in before.iter().zip(&after).enumerate() {
        let p = after.collective_parts - before.collective_parts;
        let t = after.transfers_received - before.transfers_received;
        let s = after.transfers_sent - before.transfers_sent;
        parts += p;
        transfers += t;
        sent += s;
        if p + t + s > 0 {
            took_part.push(index);
        }
    }
    println!(
        "{name} on {}: {parts} collective parts, {sent} transfers sent and {transfers} received, \
         on devices {took_part:?}",
        B::RUNTIME_NAME
    );
    assert!(
        took_part.len() >= devices,
        "{name} moved bytes on devices {took_part:?}, where it should on at least {devices}"
    );
}

/// `family::test` of cubecl-core's runtime tests, moving bytes on at least
/// `devices` devices.
macro_rules! cubecl_test {
    ($backend:ty, $family:ident :: $test:ident, $devices:expr) => {
        #[test]
        fn $test() {
            crate::run::<$backend>(stringify!($test), $devices, || {
                ::cubecl_core::runtime_tests::$family::$test::<::scope_cubecl::ScopeRuntime<$backend>>()
            });
        }
    };
}

macro_rules! families {
    ($module:ident, $backend:ty) => {
        mod $module {
            cubecl_test!($backend, to_client::test_to_client, 4);
            cubecl_test!($backend, to_client::test_to_client_concurrent, 2);

            cubecl_test!($backend, all_reduce::test_all_reduce_sync_collective, 4);
            cubecl_test!($backend, all_reduce::test_all_reduce_beside_transfers, 2);
            cubecl_test!(
                $backend,
                all_reduce::test_all_reduce_first_use_many_parts,
                4
            );
            cubecl_test!($backend, all_reduce::test_all_reduce_tensor_and_pipeline, 4);

            cubecl_test!(
                $backend,
                collectives::test_a_group_all_reduce_sums_and_averages,
                4
            );
            cubecl_test!(
                $backend,
                collectives::test_all_gather_concatenates_in_member_order,
                4
            );
            cubecl_test!(
                $backend,
                collectives::test_reduce_scatter_gives_each_member_its_chunk,
                4
            );
            cubecl_test!(
                $backend,
                collectives::test_broadcast_copies_the_root_to_every_member,
                4
            );
            cubecl_test!(
                $backend,
                collectives::test_all_to_all_exchanges_chunks_by_rank,
                4
            );
            cubecl_test!(
                $backend,
                collectives::test_a_group_without_the_first_device_gathers,
                3
            );
            cubecl_test!(
                $backend,
                collectives::test_a_group_takes_a_source_from_another_stream,
                4
            );
            cubecl_test!(
                $backend,
                collectives::test_a_transfer_moves_bytes_of_any_type,
                2
            );
            // A refusal on the caller: no part reaches a device.
            cubecl_test!(
                $backend,
                collectives::test_a_collective_refuses_a_repeated_device,
                0
            );
            cubecl_test!(
                $backend,
                collectives::test_a_refused_collective_queues_no_part,
                4
            );
            cubecl_test!(
                $backend,
                collectives::test_a_failed_part_breaks_its_group,
                4
            );
            // A group of one device, by design.
            cubecl_test!(
                $backend,
                collectives::test_a_group_of_one_device_runs_its_collectives,
                1
            );
            cubecl_test!(
                $backend,
                collectives::test_a_group_moves_bytes_no_element_type_divides,
                4
            );
            cubecl_test!(
                $backend,
                collectives::test_an_all_to_all_reads_and_writes_at_offsets,
                4
            );

            #[test]
            fn a_transfer_to_its_own_device_fails_without_waiting() {
                crate::run::<$backend>(
                    "a_transfer_to_its_own_device_fails_without_waiting",
                    1,
                    crate::to_its_own_device::<$backend>,
                );
            }

            #[test]
            fn every_scope_element_type_all_reduces() {
                crate::run::<$backend>(
                    "every_scope_element_type_all_reduces",
                    4,
                    crate::every_element_type::<$backend>,
                );
            }
        }
    };
}

/// A transfer from a device to itself has no pair of ranks to go through
/// (scope's point-to-point pairs two devices): the send is refused and the
/// receive's destination carries that at once, where a receive waiting for
/// a send would wait out scope's deadline. The device then still transfers
/// to another.
fn to_its_own_device<B: CubeBackend>() {
    let device = |index| <ScopeRuntime<B> as Runtime>::Device::from_id(DeviceId::new(0, index));
    let mut client = ScopeRuntime::<B>::client(&device(0));
    let started = std::time::Instant::now();
    let input = client.create_from_slice(&[1u8, 2, 3, 4]);
    let moved = client.to_client(input, &client.clone());
    let read = client.read_one(moved);
    assert!(read.is_err(), "a transfer to its own device read {read:?}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the refusal waited {:?}",
        started.elapsed()
    );

    let other = ScopeRuntime::<B>::client(&device(1));
    let input = client.create_from_slice(&[5u8, 6, 7, 8, 9]);
    let moved = client.to_client(input, &other);
    assert_eq!(other.read_one(moved).unwrap().to_vec(), [5, 6, 7, 8, 9]);
}

/// Four members' 8 values of `dtype`, member `m`'s value `i` being
/// `1 + (m + i) % 3`: every partial sum and mean exact in every type.
fn member_values(member: usize) -> Vec<f64> {
    (0..8).map(|i| 1.0 + ((member + i) % 3) as f64).collect()
}

/// `values` as `dtype`'s bytes.
fn encoded(dtype: ElemType, values: &[f64]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| match dtype {
            ElemType::Float(FloatKind::F16) => half::f16::from_f64(v).to_le_bytes().to_vec(),
            ElemType::Float(FloatKind::BF16) => half::bf16::from_f64(v).to_le_bytes().to_vec(),
            ElemType::Float(FloatKind::F32) => (v as f32).to_le_bytes().to_vec(),
            ElemType::Float(FloatKind::F64) => v.to_le_bytes().to_vec(),
            ElemType::Int(IntKind::I8) => (v as i8).to_le_bytes().to_vec(),
            ElemType::Int(IntKind::I32) => (v as i32).to_le_bytes().to_vec(),
            ElemType::Int(IntKind::I64) => (v as i64).to_le_bytes().to_vec(),
            ElemType::UInt(UIntKind::U8) => (v as u8).to_le_bytes().to_vec(),
            ElemType::UInt(UIntKind::U32) => (v as u32).to_le_bytes().to_vec(),
            ElemType::UInt(UIntKind::U64) => (v as u64).to_le_bytes().to_vec(),
            other => panic!("no encoding for {other:?}"),
        })
        .collect()
}

/// cubecl's `ClientGroup::all_reduce` of every element type scope reduces,
/// summed and averaged over the four logical devices: each member holds
/// the documented result (rule 45); an integer mean truncates.
fn every_element_type<B: CubeBackend>() {
    let clients = ScopeRuntime::<B>::enumerate_devices(0)
        .iter()
        .map(|id| ScopeRuntime::<B>::client(&<ScopeRuntime<B> as Runtime>::Device::from_id(*id)))
        .collect();
    let group = ClientGroup::new(clients).expect("a group over scope's transport");
    let members = group.clients().len();
    let floats = [
        FloatKind::F16,
        FloatKind::BF16,
        FloatKind::F32,
        FloatKind::F64,
    ];
    let types = floats.map(ElemType::Float).into_iter().chain([
        ElemType::Int(IntKind::I8),
        ElemType::Int(IntKind::I32),
        ElemType::Int(IntKind::I64),
        ElemType::UInt(UIntKind::U8),
        ElemType::UInt(UIntKind::U32),
        ElemType::UInt(UIntKind::U64),
    ]);
    for dtype in types {
        assert!(group.reduces(dtype), "scope's transport reduces {dtype:?}");
        for op in [ReduceOperation::Sum, ReduceOperation::Mean] {
            let buffers: Vec<MemberBuffers> = group
                .clients()
                .iter()
                .enumerate()
                .map(|(member, client)| MemberBuffers {
                    src: client.create_from_slice(&encoded(dtype, &member_values(member))),
                    dst: client.create_from_slice(&encoded(dtype, &[0.0; 8])),
                })
                .collect();
            let destinations: Vec<_> = buffers.iter().map(|b| b.dst.clone()).collect();
            group.all_reduce(buffers, dtype, op);
            let sums = (0..8).map(|i| (0..members).map(|m| member_values(m)[i]).sum::<f64>());
            let expected: Vec<f64> = match op {
                ReduceOperation::Sum => sums.collect(),
                ReduceOperation::Mean if matches!(dtype, ElemType::Float(_)) => {
                    sums.map(|s| s / members as f64).collect()
                }
                ReduceOperation::Mean => sums.map(|s| (s / members as f64).trunc()).collect(),
            };
            for (member, (client, dst)) in group.clients().iter().zip(destinations).enumerate() {
                let got = client.read_one(dst).expect("a clean all-reduce reads");
                assert_eq!(
                    got[..],
                    encoded(dtype, &expected)[..],
                    "member {member}: {dtype:?} {op:?}"
                );
            }
        }
    }
}

families!(wgpu, server_wgpu::Wgpu);
families!(vulkan, server_vulkan::Vulkan);

/// Device 0 alone, without the split, is what every other test binary sees;
/// here the split is what is listed.
#[test]
fn the_split_lists_four_devices_of_type_zero_only() {
    split_into_logical_devices(DEVICES).unwrap();
    if server_wgpu::probe().has_device() {
        let ids = ScopeRuntime::<server_wgpu::Wgpu>::enumerate_devices(0);
        assert_eq!(
            ids,
            (0..DEVICES)
                .map(|i| DeviceId::new(0, i))
                .collect::<Vec<_>>()
        );
        assert!(ScopeRuntime::<server_wgpu::Wgpu>::enumerate_devices(1).is_empty());
    }
}
