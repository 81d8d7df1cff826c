//! Where the stages of a forward pass run: the devices, the two phases (prefill and decode)
//! and a placement of every stage per phase. Shared by the planner, the GPU backend, the
//! policy and the executor.

use std::fmt;

/// Where one stage of the forward pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Gpu,
}

impl Device {
    /// The other device (a probe measures a layer there).
    pub fn other(self) -> Device {
        match self {
            Device::Cpu => Device::Gpu,
            Device::Gpu => Device::Cpu,
        }
    }
    /// Index into per-device arrays (`[cpu, gpu]`).
    pub fn index(self) -> usize {
        match self {
            Device::Cpu => 0,
            Device::Gpu => 1,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        })
    }
}

/// Prompt processing (many tokens per step) or generation (one token per step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Prefill,
    Decode,
}

impl Phase {
    pub fn index(self) -> usize {
        match self {
            Phase::Prefill => 0,
            Phase::Decode => 1,
        }
    }
}

/// The device of every stage of one forward pass.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Placement {
    /// Embedding lookup.
    pub embed: Device,
    /// Transformer block `l` runs on `layers[l]`.
    pub layers: Vec<Device>,
    /// Final norm and output projection.
    pub head: Device,
}

impl Placement {
    /// Every stage on `d`.
    pub fn all(d: Device, n_layer: usize) -> Placement {
        Placement {
            embed: d,
            layers: vec![d; n_layer],
            head: d,
        }
    }

    /// The last `n_gpu` blocks and the output head on the GPU, the rest and the embedding on the
    /// CPU (`--gpu-layers N`): counting from the output side like llama.cpp's `-ngl` keeps one
    /// crossing, and the head (the largest matmul of a small model) goes with the last block.
    /// N = 0 is all-CPU.
    pub fn gpu_layers(n_gpu: usize, n_layer: usize) -> Placement {
        let first_gpu = n_layer.saturating_sub(n_gpu);
        Placement {
            embed: Device::Cpu,
            layers: (0..n_layer)
                .map(|l| {
                    if l >= first_gpu {
                        Device::Gpu
                    } else {
                        Device::Cpu
                    }
                })
                .collect(),
            head: if n_gpu > 0 { Device::Gpu } else { Device::Cpu },
        }
    }

    /// Stages in execution order: embedding, blocks 0.., head.
    pub fn stages(&self) -> impl Iterator<Item = Device> + '_ {
        std::iter::once(self.embed)
            .chain(self.layers.iter().copied())
            .chain(std::iter::once(self.head))
    }

    /// How many times the hidden state moves between devices in one forward pass.
    pub fn crossings(&self) -> usize {
        let s: Vec<Device> = self.stages().collect();
        s.windows(2).filter(|w| w[0] != w[1]).count()
    }

    /// Whether any stage runs on `d`.
    pub fn uses(&self, d: Device) -> bool {
        self.stages().any(|s| s == d)
    }

    /// Compact text: `G` for a GPU stage, `c` for a CPU one, as `embed|blocks|head`
    /// (e.g. `c|cccGGG|G`).
    pub fn compact(&self) -> String {
        let ch = |d: Device| if d == Device::Gpu { 'G' } else { 'c' };
        let mut s = String::new();
        s.push(ch(self.embed));
        s.push('|');
        s.extend(self.layers.iter().map(|&d| ch(d)));
        s.push('|');
        s.push(ch(self.head));
        s
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.compact())
    }
}

/// A placement per phase.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PhasePlacement {
    pub prefill: Placement,
    pub decode: Placement,
}

impl PhasePlacement {
    pub fn same(p: Placement) -> PhasePlacement {
        PhasePlacement {
            prefill: p.clone(),
            decode: p,
        }
    }
    pub fn get(&self, phase: Phase) -> &Placement {
        match phase {
            Phase::Prefill => &self.prefill,
            Phase::Decode => &self.decode,
        }
    }
    pub fn get_mut(&mut self, phase: Phase) -> &mut Placement {
        match phase {
            Phase::Prefill => &mut self.prefill,
            Phase::Decode => &mut self.decode,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_layers_counts_from_the_output_side() {
        let p = Placement::gpu_layers(2, 4);
        assert_eq!(p.compact(), "c|ccGG|G");
        assert_eq!(p.crossings(), 1);
        assert_eq!(Placement::gpu_layers(0, 3).compact(), "c|ccc|c");
        assert_eq!(Placement::gpu_layers(0, 3).crossings(), 0);
        let all = Placement::all(Device::Gpu, 3);
        assert_eq!(all.compact(), "G|GGG|G");
        assert!(!all.uses(Device::Cpu));
        let mut split = Placement::all(Device::Cpu, 4);
        split.layers[1] = Device::Gpu;
        assert_eq!(split.crossings(), 2);
    }
}
