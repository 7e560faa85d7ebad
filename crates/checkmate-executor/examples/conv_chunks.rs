//! Times the CPU convolution with 1 MiB chunks against whole-sample chunks (forward and input
//! gradient), and checks that both give the same bits.
use std::time::Instant;

use candle_core::{Device, Tensor};
use checkmate_executor::conv_cpu::{self, Geom};

fn main() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    for &(n, cin, hw, cout) in &[
        (4, 3, 64, 64),
        (4, 64, 56, 64),
        (4, 128, 28, 128),
        (4, 256, 28, 256),
        (8, 512, 14, 512),
        (8, 512, 7, 512),
    ] {
        let x = Tensor::randn(0f32, 1.0, (n, cin, hw, hw), &dev)?;
        let w = Tensor::randn(0f32, 0.1, (cout, cin, 3, 3), &dev)?;
        let g = Tensor::randn(0f32, 1.0, (n, cout, hw, hw), &dev)?;
        let geo = |chunk: usize| Geom {
            n,
            cin,
            h: hw,
            w: hw,
            cout,
            kh: 3,
            kw: 3,
            oh: hw,
            ow: hw,
            stride: [1, 1],
            dilation: [1, 1],
            top: 1,
            left: 1,
            groups: 1,
            chunk_bytes: chunk,
        };
        let whole = 4 * hw * hw * cin * 9;
        let mut res = vec![];
        for chunk in [conv_cpu::CHUNK_BYTES, whole] {
            let gm = geo(chunk);
            let _ = conv_cpu::forward(&x, &w, None, &gm, true)?;
            let t = Instant::now();
            let mut y = None;
            for _ in 0..3 {
                y = Some(conv_cpu::forward(&x, &w, None, &gm, true)?);
            }
            let tf = t.elapsed().as_secs_f64() / 3.0;
            let t = Instant::now();
            let mut dx = None;
            for _ in 0..3 {
                dx = conv_cpu::gradients(None, &w, None, None, &g, &gm, true, false)?.0;
            }
            let tb = t.elapsed().as_secs_f64() / 3.0;
            res.push((tf, tb, y.unwrap(), dx.unwrap()));
        }
        let same_y = (res[0].2.clone() - res[1].2.clone())?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        let same_dx = (res[0].3.clone() - res[1].3.clone())?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        println!("{n}x{cin}x{hw}x{hw} -> {cout}: fwd {:.1} ms vs {:.1} ms ({:.2}x), dx {:.1} vs {:.1} ms ({:.2}x); whole chunk {:.1} MiB; max diff y {same_y:e} dx {same_dx:e}",
            res[0].0*1e3, res[1].0*1e3, res[0].0/res[1].0, res[0].1*1e3, res[1].1*1e3, res[0].1/res[1].1, whole as f64/1048576.0);
    }
    Ok(())
}
