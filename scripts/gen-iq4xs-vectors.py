#!/usr/bin/env python3
"""IQ4_XS test vectors for kernels-ref, made by gguf-py (the Python GGUF library that ships
with llama.cpp), an implementation independent of this project.

    pip install gguf==0.19.0 numpy
    python3 scripts/gen-iq4xs-vectors.py kernels-ref/tests/data/iq4_xs.gguf

Writes one GGUF file: `iq4_xs.<ne0>x<ne1>` IQ4_XS tensors of random blocks (every bit of the
codes and 6-bit scales random; the f16 scale d set to a finite value in [0.001, 0.05]), and
`<name>.expected` F32 tensors: gguf-py's dequantization of exactly those blocks.
"""
import sys

import numpy as np
import gguf
from gguf import quants

BLOCK_BYTES = 136  # f16 d, u16 scales_h, 4 bytes scales_l, 128 bytes of nibbles
QK = 256


def blocks(rng, n):
    b = rng.integers(0, 256, size=(n, BLOCK_BYTES), dtype=np.uint8)
    d = rng.uniform(0.001, 0.05, size=n).astype(np.float16)
    b[:, 0:2] = d.view(np.uint8).reshape(n, 2)
    return b


def main(path):
    rng = np.random.default_rng(0x1a4)
    w = gguf.GGUFWriter(path, "memwall-iq4xs-vectors")
    for ne0, ne1 in [(256, 1), (512, 3), (1536, 2)]:
        nb = ne0 // QK
        raw = blocks(rng, nb * ne1)
        expected = quants.dequantize(raw.reshape(ne1, nb * BLOCK_BYTES), gguf.GGMLQuantizationType.IQ4_XS)
        name = f"iq4_xs.{ne0}x{ne1}"
        w.add_tensor(name, raw.reshape(ne1, nb * BLOCK_BYTES), raw_dtype=gguf.GGMLQuantizationType.IQ4_XS)
        w.add_tensor(name + ".expected", expected.astype(np.float32).reshape(ne1, ne0))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(sys.argv[1])
