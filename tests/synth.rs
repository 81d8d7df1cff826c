//! `memwall synth`: the written model is the in-memory GgufWriter image byte for byte, passes
//! `check`, has the requested type in every matrix with values of the generated distribution
//! (each --type round-trips through its block format), and loads and generates on the CPU; the
//! MoE preset matches the kernels-ref forward pass.

mod common;

use kernels_ref::GgmlType;
use memwall::engine::{LoadOptions, Model};
use memwall::gguf::Gguf;
use memwall::tools::bench::synth::{parse_type, synth_writer, write_synth, Preset, SynthOptions};

#[test]
fn every_type_round_trips_loads_and_generates() {
    let dir = std::env::temp_dir().join(format!("memwall-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, ty) in [
        ("q4_0", GgmlType::Q4_0),
        ("q4_1", GgmlType::Q4_1),
        ("q8_0", GgmlType::Q8_0),
        ("f16", GgmlType::F16),
    ] {
        assert_eq!(parse_type(name).unwrap(), ty);
        let o = SynthOptions::new(Preset::Tiny, Some(3), ty, 7);
        let path = dir.join(format!("{name}.gguf"));
        let r = write_synth(&path, &o, &mut |_, _| {}).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(r.file_bytes, bytes.len() as u64);
        // The streamed file is the writer's image (the independent, in-memory path).
        assert!(
            bytes == synth_writer(&o).unwrap().to_bytes(),
            "{name}: streamed image differs"
        );
        let report = memwall::tools::check::check_file(&path);
        assert!(report.is_ok(), "{name}: {:?}", report.problems);

        let g = Gguf::open(&path).unwrap();
        assert_eq!(g.get_u32("llama.block_count").unwrap(), 3);
        assert_eq!(
            r.n_params,
            g.tensors().iter().map(|t| t.n_elements).sum::<u64>()
        );
        for t in g.tensors() {
            let data = g.tensor_data(t);
            let v = kernels_ref::dequantize_vec(t.ty, data, t.n_elements as usize).unwrap();
            if t.dims.len() == 1 {
                assert_eq!(t.ty, GgmlType::F32, "{}", t.name);
                assert!(v.iter().all(|x| (0.9..=1.1).contains(x)), "{}", t.name);
                continue;
            }
            assert_eq!(t.ty, ty, "{}", t.name);
            // Uniform in [-a, a], a = 1 / sqrt(row length) (1 for the embedding): the
            // decoded values stay within a plus one quantization step of the format, and
            // their standard deviation is a / sqrt(3) to within sampling and rounding.
            let a = if t.name == "token_embd.weight" {
                1.0
            } else {
                1.0 / (t.dims[0] as f64).sqrt()
            };
            let step = match ty {
                GgmlType::Q4_0 | GgmlType::Q4_1 => 2.0 * a / 15.0,
                GgmlType::Q8_0 => a / 127.0,
                _ => a * 1e-3,
            };
            let max = v.iter().map(|x| f64::from(x.abs())).fold(0.0, f64::max);
            assert!(max <= a + step, "{} {name}: max {max} vs {a}", t.name);
            let n = v.len() as f64;
            let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
            let sd = (v
                .iter()
                .map(|&x| (f64::from(x) - mean).powi(2))
                .sum::<f64>()
                / n)
                .sqrt();
            let want = a / 3f64.sqrt();
            assert!(
                (sd - want).abs() < 0.1 * want,
                "{} {name}: sd {sd} vs {want}",
                t.name
            );
            assert!(mean.abs() < 0.05 * a, "{} {name}: mean {mean}", t.name);
        }

        let model = Model::load(&path, &LoadOptions::default()).unwrap();
        let prompt = model.tokenizer().encode("hello world", false, false);
        assert!(!prompt.is_empty());
        let mut s = model.session_with_ctx(64).unwrap();
        s.set_max_tokens(8);
        let gen = s.generate(&prompt, |_| true).unwrap();
        assert!(!gen.generated_ids.is_empty(), "{name}: nothing generated");
        let logits = s.eval(&[1, 2, 3], memwall::model::Logits::Last).unwrap();
        assert_eq!(logits.len(), 512);
        assert!(
            logits.iter().all(|x| x.is_finite()),
            "{name}: non-finite logits"
        );
        // Random weights give a spread of logits, not a constant.
        let spread = logits.iter().fold(f32::MIN, |m, &x| m.max(x))
            - logits.iter().fold(f32::MAX, |m, &x| m.min(x));
        assert!(spread > 0.1, "{name}: logits spread {spread}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn synth_cli_writes_a_model_and_refuses_bad_options() {
    let dir = std::env::temp_dir().join(format!("memwall-synth-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.gguf");
    let p = path.to_str().unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_memwall"))
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&[
        "synth", "-o", p, "--preset", "tiny", "--layers", "1", "--type", "q8_0",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 1);
    assert_eq!(
        g.require_tensor("blk.0.ffn_up.weight").unwrap().ty,
        GgmlType::Q8_0
    );
    for bad in [
        vec!["synth", "-o", p, "--type", "q5_k"],
        vec!["synth", "-o", p, "--preset", "13b"],
        vec!["synth", "-o", p, "--layers", "0"],
    ] {
        let o = run(&bad);
        assert!(!o.status.success(), "{bad:?} succeeded");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("error"),
            "{bad:?}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The qwen3moe preset (`tiny-moe`): the streamed image is the writer's, it passes `check`, and
/// its logits match the kernels-ref forward pass (per-head Q/K norms, a head size that is not
/// n_embd / n_head, the router and expert stacks), in one batch and token by token.
#[test]
fn the_moe_preset_is_a_qwen3moe_model_matching_the_reference() {
    let dir = std::env::temp_dir().join(format!("memwall-synth-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let o = SynthOptions::new(Preset::TinyMoe, Some(2), GgmlType::F16, 5);
    let path = dir.join("tiny-moe.gguf");
    write_synth(&path, &o, &mut |_, _| {}).unwrap();
    assert!(std::fs::read(&path).unwrap() == synth_writer(&o).unwrap().to_bytes());
    let report = memwall::tools::check::check_file(&path);
    assert!(report.is_ok(), "{:?}", report.problems);
    let model = Model::load(&path, &LoadOptions::default()).unwrap();
    let c = model.config().clone();
    assert_eq!(c.arch, "qwen3moe");
    assert_eq!(c.head_dim, 32);
    let m = c.moe.clone().expect("experts");
    assert_eq!((m.n_expert, m.n_expert_used, m.n_ff_exp), (8, 2, 64));
    let g = Gguf::open(&path).unwrap();
    let ids: Vec<u32> = (0..12).map(|i| 7 + i * 31).collect();
    let want = common::reference_forward(&g, &c, &ids, 64);
    let mut s = model.session_with_ctx(64).unwrap();
    let got = s.eval(&ids, memwall::model::Logits::All).unwrap();
    // F16 weights take the f32 dot products: rounding only.
    let e = common::rel_err(&got, &want);
    assert!(e < 2e-3, "logits differ by {e}");
    let mut s = model.session_with_ctx(64).unwrap();
    let mut step = Vec::new();
    for &id in &ids {
        step.extend(s.eval(&[id], memwall::model::Logits::All).unwrap());
    }
    let e = common::rel_err(&step, &want);
    assert!(e < 2e-3, "token by token: {e}");
    std::fs::remove_dir_all(&dir).ok();
}
