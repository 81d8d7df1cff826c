//! The CPU backend: `Backend` over the fast kernels in `cpu`, reading weights straight from the
//! memory map. Norm weights and biases (a few KB per layer) are copied to f32 at start-up.

use std::collections::HashMap;
use std::sync::Arc;

use rayon::prelude::*;

use crate::backend::{Backend, WeightId};
use crate::config::{Config, RopeKind};
use crate::cpu::{MatmulScratch, WeightView};
use crate::error::{Error, Result};
use crate::gguf::{Gguf, TensorInfo};
use kernels_ref::GgmlType;

/// Below this many rows (tokens), small element-wise ops run on the calling thread: handing
/// a 576-element norm to the pool costs more than doing it.
const PAR_MIN_ROWS: usize = 4;

/// Where a matrix lives in the file and how it is shaped.
#[derive(Debug, Clone, Copy)]
struct MatRef {
    ty: GgmlType,
    offset: usize,
    n_bytes: usize,
    /// ne1: output features.
    rows: usize,
    /// ne0: input features.
    cols: usize,
}

/// Layer `l`'s KV cache: K and V each [n_head_kv, n_ctx, head_dim], so one head's keys are
/// contiguous and the attention scan streams through memory.
struct LayerKv {
    k: Vec<f32>,
    v: Vec<f32>,
}

pub struct CpuBackend {
    gguf: Arc<Gguf>,
    cfg: Config,
    n_ctx: usize,
    mats: HashMap<WeightId, MatRef>,
    /// Norm weights and biases as f32, [width] each.
    vecs: HashMap<WeightId, Vec<f32>>,
    kv: Vec<LayerKv>,
    /// [n_rot / 2] inverse frequencies base^(-2i/n_rot), times the position scale.
    inv_freq: Vec<f32>,
    mm: MatmulScratch,
}

fn expect_shape(t: &TensorInfo, dims: &[usize]) -> Result<()> {
    let got: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
    if got != dims {
        return Err(Error::Tensor {
            name: t.name.clone(),
            msg: format!("has shape {got:?}, the configuration needs {dims:?}"),
        });
    }
    Ok(())
}

impl CpuBackend {
    /// Every weight the forward pass uses, with the shape ([ne0, ne1]) it must have.
    fn expected(cfg: &Config) -> Vec<(WeightId, Vec<usize>)> {
        use WeightId::*;
        let (e, q, kv, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        let mut v = vec![(TokEmbd, vec![e, cfg.n_vocab]), (OutputNorm, vec![e])];
        if !cfg.tied_embeddings {
            v.push((Output, vec![e, cfg.n_vocab]));
        }
        for l in 0..cfg.n_layer {
            v.extend([
                (AttnNorm(l), vec![e]),
                (Wq(l), vec![e, q]),
                (Wk(l), vec![e, kv]),
                (Wv(l), vec![e, kv]),
                (Wo(l), vec![q, e]),
                (FfnNorm(l), vec![e]),
                (Gate(l), vec![e, ff]),
                (Up(l), vec![e, ff]),
                (Down(l), vec![ff, e]),
            ]);
            if cfg.qkv_bias {
                v.extend([(Bq(l), vec![q]), (Bk(l), vec![kv]), (Bv(l), vec![kv])]);
            }
        }
        v
    }

    /// Checks that every weight exists with the right shape and a type the CPU can compute
    /// with, naming the first tensor that does not.
    pub fn check_weights(g: &Gguf, cfg: &Config) -> Result<()> {
        for (id, dims) in Self::expected(cfg) {
            let t = g.require_tensor(&id.tensor_name())?;
            expect_shape(t, &dims)?;
            if !t.ty.is_supported() {
                return Err(Error::UnsupportedType {
                    ty: t.ty,
                    what: t.name.clone(),
                });
            }
        }
        Ok(())
    }

    pub fn new(gguf: Arc<Gguf>, cfg: Config, n_ctx: usize) -> Result<CpuBackend> {
        Self::check_weights(&gguf, &cfg)?;
        let mut mats = HashMap::new();
        let mut vecs = HashMap::new();
        for (id, dims) in Self::expected(&cfg) {
            let t = gguf.require_tensor(&id.tensor_name())?;
            if dims.len() == 1 {
                let v = kernels_ref::dequantize_vec(t.ty, gguf.tensor_data(t), dims[0]).map_err(
                    |e| Error::Tensor {
                        name: t.name.clone(),
                        msg: e.to_string(),
                    },
                )?;
                vecs.insert(id, v);
            } else {
                mats.insert(
                    id,
                    MatRef {
                        ty: t.ty,
                        offset: t.file_offset as usize,
                        n_bytes: t.n_bytes as usize,
                        rows: dims[1],
                        cols: dims[0],
                    },
                );
            }
        }
        let per_layer = cfg.n_head_kv * n_ctx * cfg.head_dim;
        let kv = (0..cfg.n_layer)
            .map(|_| LayerKv {
                k: vec![0.0; per_layer],
                v: vec![0.0; per_layer],
            })
            .collect();
        let half = cfg.n_rot / 2;
        let inv_freq = (0..half)
            .map(|i| {
                (cfg.rope_freq_scale as f64
                    * (cfg.rope_base as f64).powf(-2.0 * i as f64 / cfg.n_rot as f64))
                    as f32
            })
            .collect();
        Ok(CpuBackend {
            gguf,
            cfg,
            n_ctx,
            mats,
            vecs,
            kv,
            inv_freq,
            mm: MatmulScratch::default(),
        })
    }

    fn vec(&self, id: WeightId) -> Result<&[f32]> {
        self.vecs
            .get(&id)
            .map(|v| v.as_slice())
            .ok_or_else(|| Error::Tensor {
                name: id.tensor_name(),
                msg: "is not a vector of this model".into(),
            })
    }
}

impl Backend for CpuBackend {
    type Act = Vec<f32>;

    fn name(&self) -> String {
        "cpu".into()
    }

    fn alloc(&mut self, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; len])
    }

    fn write(&mut self, dst: &mut Vec<f32>, src: &[f32]) -> Result<()> {
        dst[..src.len()].copy_from_slice(src);
        Ok(())
    }

    fn read(&mut self, src: &Vec<f32>, dst: &mut [f32]) -> Result<()> {
        let n = dst.len();
        dst.copy_from_slice(&src[..n]);
        Ok(())
    }

    fn embed(&mut self, ids: &[u32], out: &mut Vec<f32>) -> Result<()> {
        let m = self.mats[&WeightId::TokEmbd];
        let row_bytes = m.n_bytes / m.rows;
        let table = &self.gguf.bytes()[m.offset..m.offset + m.n_bytes];
        for (i, &id) in ids.iter().enumerate() {
            let id = id as usize;
            if id >= m.rows {
                return Err(Error::InvalidArgument(format!(
                    "token id {id} is outside the vocabulary of {}",
                    m.rows
                )));
            }
            kernels_ref::dequantize(
                m.ty,
                &table[id * row_bytes..(id + 1) * row_bytes],
                &mut out[i * m.cols..(i + 1) * m.cols],
            )
            .map_err(|e| Error::Tensor {
                name: WeightId::TokEmbd.tensor_name(),
                msg: e.to_string(),
            })?;
        }
        Ok(())
    }

    fn rms_norm(
        &mut self,
        norm: WeightId,
        x: &Vec<f32>,
        n: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let w = self.vec(norm)?;
        let width = w.len();
        let eps = self.cfg.rms_eps;
        let norm_row = |(o, xr): (&mut [f32], &[f32])| {
            let ss: f32 = xr.iter().map(|v| v * v).sum();
            let scale = 1.0 / (ss / width as f32 + eps).sqrt();
            for ((o, &xv), &wv) in o.iter_mut().zip(xr).zip(w) {
                *o = xv * scale * wv;
            }
        };
        let (o, x) = (&mut out[..n * width], &x[..n * width]);
        if n >= PAR_MIN_ROWS {
            o.par_chunks_mut(width)
                .zip(x.par_chunks(width))
                .for_each(norm_row);
        } else {
            o.chunks_mut(width).zip(x.chunks(width)).for_each(norm_row);
        }
        Ok(())
    }

    fn matmul(&mut self, w: WeightId, x: &Vec<f32>, n: usize, out: &mut Vec<f32>) -> Result<()> {
        let m = self.mats.get(&w).copied().ok_or_else(|| Error::Tensor {
            name: w.tensor_name(),
            msg: "is not a matrix of this model".into(),
        })?;
        let data = &self.gguf.bytes()[m.offset..m.offset + m.n_bytes];
        let view = WeightView::new(m.ty, data, m.rows, m.cols)?;
        crate::cpu::matmul(
            &view,
            &x[..n * m.cols],
            n,
            &mut out[..n * m.rows],
            &mut self.mm,
        )
    }

    fn add_bias(&mut self, bias: WeightId, x: &mut Vec<f32>, n: usize) -> Result<()> {
        let b = self.vec(bias)?;
        for row in x[..n * b.len()].chunks_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, bv)| *v += bv);
        }
        Ok(())
    }

    fn rope(&mut self, x: &mut Vec<f32>, n: usize, n_heads: usize, pos0: usize) -> Result<()> {
        let hd = self.cfg.head_dim;
        let half = self.cfg.n_rot / 2;
        let neox = self.cfg.rope_kind == RopeKind::Neox;
        let inv_freq = &self.inv_freq;
        let rotate = |(i, tok): (usize, &mut [f32])| {
            let pos = (pos0 + i) as f32;
            for (j, &f) in inv_freq.iter().enumerate().take(half) {
                let (sin, cos) = (pos * f).sin_cos();
                let (a, b) = if neox {
                    (j, j + half)
                } else {
                    (2 * j, 2 * j + 1)
                };
                for head in tok.chunks_mut(hd) {
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * cos - x1 * sin;
                    head[b] = x0 * sin + x1 * cos;
                }
            }
        };
        let x = &mut x[..n * n_heads * hd];
        if n >= PAR_MIN_ROWS {
            x.par_chunks_mut(n_heads * hd).enumerate().for_each(rotate);
        } else {
            x.chunks_mut(n_heads * hd).enumerate().for_each(rotate);
        }
        Ok(())
    }

    fn attention(
        &mut self,
        layer: usize,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        n: usize,
        pos0: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let (hd, n_head, n_kv) = (self.cfg.head_dim, self.cfg.n_head, self.cfg.n_head_kv);
        let n_ctx = self.n_ctx;
        if pos0 + n > n_ctx {
            return Err(Error::ContextOverflow {
                n_prompt: pos0 + n,
                n_ctx,
            });
        }
        let cache = &mut self.kv[layer];
        // Store the new keys and values: [n, n_kv, hd] -> [n_kv, n_ctx, hd].
        for i in 0..n {
            for h in 0..n_kv {
                let src = (i * n_kv + h) * hd;
                let dst = (h * n_ctx + pos0 + i) * hd;
                cache.k[dst..dst + hd].copy_from_slice(&k[src..src + hd]);
                cache.v[dst..dst + hd].copy_from_slice(&v[src..src + hd]);
            }
        }
        let (kc, vc) = (&cache.k, &cache.v);
        let group = n_head / n_kv;
        let scale = 1.0 / (hd as f32).sqrt();
        // One task per (token, head): out row [hd].
        let attend = |scores: &mut Vec<f32>, (idx, o): (usize, &mut [f32])| {
            let (i, h) = (idx / n_head, idx % n_head);
            let kvh = h / group;
            let qv = &q[idx * hd..(idx + 1) * hd];
            let n_keys = pos0 + i + 1;
            let kh = &kc[kvh * n_ctx * hd..(kvh * n_ctx + n_keys) * hd];
            let vh = &vc[kvh * n_ctx * hd..(kvh * n_ctx + n_keys) * hd];
            scores.clear();
            scores.extend(
                kh.chunks_exact(hd)
                    .map(|kr| kr.iter().zip(qv).map(|(a, b)| a * b).sum::<f32>() * scale),
            );
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            o.fill(0.0);
            for (s, vr) in scores.iter().zip(vh.chunks_exact(hd)) {
                let w = s / sum;
                o.iter_mut().zip(vr).for_each(|(ov, vv)| *ov += w * vv);
            }
        };
        let o = &mut out[..n * n_head * hd];
        // Work in key-head dot products; below a few thousand the pool costs more than it saves.
        if n * n_head * (pos0 + n) >= 4096 {
            o.par_chunks_mut(hd)
                .enumerate()
                .for_each_init(Vec::new, attend);
        } else {
            let mut scores = Vec::with_capacity(pos0 + n);
            o.chunks_mut(hd)
                .enumerate()
                .for_each(|item| attend(&mut scores, item));
        }
        Ok(())
    }

    fn swiglu(&mut self, gate: &mut Vec<f32>, up: &Vec<f32>, len: usize) -> Result<()> {
        let f = |(g, u): (&mut [f32], &[f32])| {
            for (gv, &uv) in g.iter_mut().zip(u) {
                *gv = *gv / (1.0 + (-*gv).exp()) * uv;
            }
        };
        const CHUNK: usize = 4096;
        let (g, u) = (&mut gate[..len], &up[..len]);
        if len >= 4 * CHUNK {
            g.par_chunks_mut(CHUNK).zip(u.par_chunks(CHUNK)).for_each(f);
        } else {
            f((g, u));
        }
        Ok(())
    }

    fn add(&mut self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) -> Result<()> {
        x[..len]
            .iter_mut()
            .zip(&y[..len])
            .for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn copy_rows(
        &mut self,
        x: &Vec<f32>,
        first: usize,
        n_rows: usize,
        width: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        out[..n_rows * width].copy_from_slice(&x[first * width..(first + n_rows) * width]);
        Ok(())
    }
}
