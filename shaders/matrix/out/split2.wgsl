// Output of the 8-bit matrix layouts over two matrices stacked by rows (gate | up): global row
// g = row_offset + row goes to y: [n_tokens, split1] when below split1, else to
// y1: [n_tokens, y_stride - split1] (y_stride = the stacked matrix's rows).

@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<storage, read_write> y1: array<f32>;

fn store_y(t: u32, row: u32, v: f32) {
    let g = P.row_offset + row;
    if (g < P.split1) {
        y[t * P.split1 + g] = v;
    } else {
        y1[t * (P.y_stride - P.split1) + g - P.split1] = v;
    }
}
