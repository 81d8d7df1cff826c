use super::*;
use crate::ground::{format_size, parse_count, parse_size, Device, Placement};

#[test]
fn parse_size_units() {
    assert_eq!(parse_size("1000000").unwrap(), 1_000_000);
    assert_eq!(parse_size("600B").unwrap(), 600);
    assert_eq!(parse_size("512M").unwrap(), 512 * 1024 * 1024);
    assert_eq!(parse_size("6G").unwrap(), 6 * 1024 * 1024 * 1024);
    assert_eq!(parse_size("6g").unwrap(), 6 << 30);
    assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
    assert_eq!(parse_size("2KiB").unwrap(), 2048);
    assert_eq!(parse_size("1T").unwrap(), 1 << 40);
    assert_eq!(parse_size("800MB").unwrap(), 800_000_000);
    assert_eq!(parse_size("24GB").unwrap(), 24_000_000_000);
    assert_eq!(parse_size(" 4 G ").unwrap(), 4 << 30);
    assert_eq!(parse_size(".5K").unwrap(), 512);
    // 0.3 KiB = 307.2 bytes, rounded to the nearest byte.
    assert_eq!(parse_size("0.3K").unwrap(), 307);
}

#[test]
fn parse_size_errors_name_the_text() {
    for bad in [
        "",
        "G",
        "-5G",
        "5X",
        "1.2.3G",
        "5 GiBs",
        "99999999999999999999999T",
    ] {
        let e = parse_size(bad).unwrap_err().to_string();
        assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
    }
}

#[test]
fn parse_count_units() {
    assert_eq!(parse_count("35B").unwrap(), 35_000_000_000);
    assert_eq!(parse_count("135M").unwrap(), 135_000_000);
    assert_eq!(parse_count("1.5t").unwrap(), 1_500_000_000_000);
    assert_eq!(parse_count("7000").unwrap(), 7000);
    assert!(parse_count("35G").is_err());
    assert!(parse_count("abc").is_err());
}

#[test]
fn format_size_is_decimal() {
    assert_eq!(format_size(8_589_934_592), "8.59 GB");
    assert_eq!(format_size(17_500_000_000), "17.50 GB");
    assert_eq!(format_size(999), "999 B");
    assert_eq!(format_size(1_500), "1.50 kB");
    assert_eq!(format_size(0), "0 B");
}

fn spec_35b(kv_heads: usize) -> ArchSpec {
    ArchSpec {
        params: Some(35_000_000_000),
        n_layer: Some(64),
        n_head: Some(64),
        n_head_kv: Some(kv_heads),
        head_dim: Some(128),
        n_ctx: Some(4096),
        weight_bits: Some(4.0),
        kv_bits: Some(16.0),
        ..ArchSpec::default()
    }
}

#[test]
fn arch_35b_by_hand() {
    let m = MemoryModel::from_arch(&spec_35b(64)).unwrap();
    // K and V, layers, heads, head size, positions, 2 bytes (f16).
    assert_eq!(m.kv_total(), 2 * 64 * 64 * 128 * 4096 * 2);
    assert_eq!(m.kv_bytes_per_layer, 2 * 64 * 128 * 4096 * 2);
    // 35e9 parameters at 4 bits = half a byte each.
    assert_eq!(m.weights_total(), 35_000_000_000 / 2);
    let gqa = MemoryModel::from_arch(&spec_35b(8)).unwrap();
    assert_eq!(gqa.kv_total() * 8, m.kv_total());
    assert_eq!(gqa.weights_total(), m.weights_total());
}

#[test]
fn arch_errors() {
    type Edit = fn(&mut ArchSpec);
    let cases: &[(Edit, &str)] = &[
        (|a| a.n_layer = None, "--layers"),
        (|a| a.n_layer = Some(0), "--layers"),
        (|a| a.n_head_kv = Some(7), "multiple"),
        (|a| a.weight_bits = None, "--weight-bits"),
        (|a| a.weight_bits = Some(f64::NAN), "bit width"),
        (|a| a.kv_bits = Some(0.0), "bit width"),
        (|a| a.head_dim = None, "--head-dim"),
        (
            |a| {
                a.head_dim = None;
                a.n_embd = Some(1000);
            },
            "multiple",
        ),
        (|a| a.params = Some(1000), "feed-forward"),
        (|a| a.n_ctx = Some(0), "--ctx"),
        (|a| a.n_layer = Some(usize::MAX), "larger"),
        (|a| a.n_ff = Some(usize::MAX), "larger"),
        (|a| a.params = Some(u64::MAX), "derived from --params"),
        (
            |a| {
                a.params = Some(u64::MAX);
                a.weight_bits = Some(64.0);
                a.n_ff = Some(100);
            },
            "overflow",
        ),
        (
            |a| {
                a.params = Some(1 << 62);
                a.weight_bits = Some(16.0);
                a.n_ff = Some(100);
            },
            "a plan handles",
        ),
    ];
    for (edit, want) in cases {
        let mut spec = spec_35b(8);
        edit(&mut spec);
        let e = MemoryModel::from_arch(&spec).unwrap_err().to_string();
        assert!(e.contains(want), "{spec:?}: {e}");
    }
}

/// A small hand-made model: 4 blocks of 100 bytes, KV 10 per layer, head 300, embedding 50.
fn toy(tied: bool) -> MemoryModel {
    MemoryModel {
        source: "toy".into(),
        n_layer: 4,
        n_ctx: 8,
        embed_bytes: 50,
        layer_weight_bytes: vec![100; 4],
        head_bytes: 300,
        cpu_packed_layer_bytes: vec![0; 4],
        cpu_packed_head_bytes: 0,
        other_bytes: 0,
        tied_embeddings: tied,
        kv_bits: 32.0,
        kv_bytes_per_layer: 10,
        cpu_scratch_bytes: 7,
        gpu_scratch_bytes: 5,
        gpu_staging_bytes: 1,
        gpu_transfer_bytes: 3,
    }
}

/// Packed CPU weights are anonymous memory in place of the mmap pages they replace; the GPU's
/// share is unchanged; a tied head's packed table comes on top of the embedding's pages.
#[test]
fn account_packed_cpu_weights() {
    for tied in [false, true] {
        let mut m = toy(tied);
        m.cpu_packed_layer_bytes = vec![60; 4];
        m.cpu_packed_head_bytes = 200;
        let [cpu, _] = account(&m, &Placement::all(Device::Cpu, 4));
        let head = if tied { 300 } else { 100 };
        assert_eq!(cpu.weights, 50 + 4 * 40 + head, "tied {tied}");
        assert_eq!(cpu.packed, 4 * 60 + 200);
        assert_eq!(cpu.anonymous(), cpu.kv + cpu.scratch + cpu.packed);
        assert_eq!(cpu.peak, cpu.weights + cpu.anonymous());
        let [c2, g2] = account(&m, &Placement::gpu_layers(2, 4));
        assert_eq!((c2.packed, g2.packed), (2 * 60, 0));
        assert_eq!(g2, account(&toy(tied), &Placement::gpu_layers(2, 4))[1]);
    }
}

#[test]
fn account_by_hand() {
    let m = toy(false);
    let [cpu, gpu] = account(&m, &Placement::gpu_layers(2, 4));
    // GPU: blocks 2, 3 (2 × 100 + 2 × 10 KV), head 300, scratch 5, staging 1 (no GPU→CPU
    // crossing: the head is on the GPU).
    assert_eq!(
        gpu,
        DeviceUse {
            weights: 500,
            kv: 20,
            scratch: 5,
            staging: 1,
            packed: 0,
            peak: 526
        }
    );
    // CPU: embedding 50, blocks 0, 1.
    assert_eq!(
        cpu,
        DeviceUse {
            weights: 250,
            kv: 20,
            scratch: 7,
            staging: 0,
            packed: 0,
            peak: 277
        }
    );
    // Head on the CPU: the hidden state comes back, staging grows to the transfer size; a
    // tied head on the CPU reads the embedding the CPU already holds.
    let mut p = Placement::gpu_layers(2, 4);
    p.head = Device::Cpu;
    let [cpu, gpu] = account(&toy(true), &p);
    assert_eq!(gpu.staging, 3);
    assert_eq!(gpu.weights, 200);
    assert_eq!(cpu.weights, 50 + 200 + 300);
    // A tied head on the GPU holds its own copy of the embedding table.
    let [cpu, gpu] = account(&toy(true), &Placement::gpu_layers(1, 4));
    assert_eq!(gpu.weights, 100 + 300 + 50);
    assert_eq!(cpu.weights, 50 + 300);
    // Everything on one device: every byte once.
    let [cpu, gpu] = account(&toy(true), &Placement::all(Device::Gpu, 4));
    assert_eq!(gpu.weights, toy(true).weights_total());
    assert_eq!(cpu, DeviceUse::default());
}

#[test]
fn fit_prefers_bytes_then_fewer_crossings() {
    let m = toy(false);
    // Nothing fits below the runtime buffers.
    assert_eq!(fit(&m, 5).placement, Placement::all(Device::Cpu, 4));
    // 5 + 1 + 300 = 306: the head alone (300 bytes) beats 2 blocks (220 bytes, 5+3 runtime).
    let f = fit(&m, 306);
    assert_eq!(f.placement.compact(), "c|cccc|G");
    assert_eq!((f.resident_layers, f.streamed_layers), (0, 4));
    assert_eq!(f.streamed_bytes, 400);
    // Everything: 50 + 400 + 40 + 300 + 5 + 1.
    let f = fit(&m, 796);
    assert!(f.fits_all);
    assert_eq!(f.placement.compact(), "G|GGGG|G");
    // One byte less: the (untied) embedding stays on the CPU.
    let f = fit(&m, 795);
    assert_eq!(f.placement.compact(), "c|GGGG|G");
    // Tied: a GPU head holds the embedding table anyway, so c|GGGG|G and G|GGGG|G keep the
    // same bytes (750 + 40) and the one without a crossing wins.
    let [_, gpu] = account(&toy(true), &Placement::gpu_layers(4, 4));
    assert_eq!(gpu.peak, 796);
    assert_eq!(fit(&toy(true), 796).placement.compact(), "G|GGGG|G");
}

#[test]
fn fit_sweep_within_budget_and_monotone() {
    for m in [toy(false), toy(true)] {
        let mut last = 0;
        for budget in 0..1000 {
            let f = fit(&m, budget);
            let [_, gpu] = account(&m, &f.placement);
            assert_eq!(gpu, f.gpu);
            assert!(gpu.peak <= budget, "{budget}: {gpu:?}");
            let resident = gpu.weights + gpu.kv;
            assert!(resident >= last, "budget {budget}: {resident} < {last}");
            last = resident;
        }
    }
}
