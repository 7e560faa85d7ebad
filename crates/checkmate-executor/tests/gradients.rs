//! Every backward rule against central finite differences in f64 on small random inputs.

use candle_core::{DType, Device, Tensor};
use checkmate_executor::kernels as k;
use checkmate_models::{Activation, Conv2d, ConvTranspose2d, Padding, Pool2d};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn rand_t(dims: &[usize], seed: u64) -> Tensor {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n: usize = dims.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
}

/// `sum(r * t)` as f64.
fn dot(t: &Tensor, r: &Tensor) -> f64 {
    t.mul(r)
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

/// Checks `analytic` against central differences of `f` at every element of `x`.
fn check(name: &str, x: &Tensor, analytic: &Tensor, f: impl Fn(&Tensor) -> f64) {
    assert_eq!(x.dims(), analytic.dims(), "{name}: gradient shape");
    let base = x.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let got = analytic.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let eps = 1e-6;
    for i in 0..base.len() {
        let mut p = base.clone();
        p[i] += eps;
        let fp = f(&Tensor::from_vec(p.clone(), x.dims(), &Device::Cpu).unwrap());
        p[i] -= 2.0 * eps;
        let fm = f(&Tensor::from_vec(p, x.dims(), &Device::Cpu).unwrap());
        let num = (fp - fm) / (2.0 * eps);
        let tol = 1e-6 * (1.0 + num.abs());
        assert!(
            (num - got[i]).abs() <= tol,
            "{name}[{i}]: numeric {num}, analytic {}",
            got[i]
        );
    }
}

#[test]
fn dense_with_each_activation() {
    let x = rand_t(&[3, 4], 1);
    let w = rand_t(&[5, 4], 2);
    let b = rand_t(&[5], 3);
    let r = rand_t(&[3, 5], 4);
    for act in [
        Activation::Linear,
        Activation::Relu,
        Activation::Relu6,
        Activation::Softmax,
    ] {
        let fwd = |x: &Tensor, w: &Tensor, b: &Tensor| {
            let z = k::dense_forward(x, w, Some(b)).unwrap();
            k::activation_forward(&z, act, 1).unwrap()
        };
        let y = fwd(&x, &w, &b);
        let g = k::activation_backward(None, &y, &r, act, 1).unwrap();
        let (dx, dw, db) = k::dense_backward(&x, &w, &g, true, true).unwrap();
        let name = act.name();
        check(&format!("dense {name} dx"), &x, &dx.unwrap(), |x| {
            dot(&fwd(x, &w, &b), &r)
        });
        check(&format!("dense {name} dw"), &w, dw.as_ref().unwrap(), |w| {
            dot(&fwd(&x, w, &b), &r)
        });
        check(&format!("dense {name} db"), &b, &db, |b| {
            dot(&fwd(&x, &w, b), &r)
        });
    }
}

#[test]
fn dense_on_rank3_input() {
    let x = rand_t(&[2, 3, 4], 5);
    let w = rand_t(&[2, 4], 6);
    let r = rand_t(&[2, 3, 2], 7);
    let (dx, dw, _) = k::dense_backward(&x, &w, &r, true, true).unwrap();
    check("dense3 dx", &x, &dx.unwrap(), |x| {
        dot(&k::dense_forward(x, &w, None).unwrap(), &r)
    });
    check("dense3 dw", &w, dw.as_ref().unwrap(), |w| {
        dot(&k::dense_forward(&x, w, None).unwrap(), &r)
    });
}

#[test]
fn gelu_standalone() {
    let x = rand_t(&[2, 3, 2, 2], 8);
    let r = rand_t(&[2, 3, 2, 2], 9);
    let y = k::activation_forward(&x, Activation::Gelu, 1).unwrap();
    let dx = k::activation_backward(Some(&x), &y, &r, Activation::Gelu, 1).unwrap();
    check("gelu", &x, &dx, |x| {
        dot(&k::activation_forward(x, Activation::Gelu, 1).unwrap(), &r)
    });
}

fn conv_case(c: Conv2d, input: [usize; 4], seed: u64) {
    let x = rand_t(&input, seed);
    let w = rand_t(
        &[c.filters, input[1] / c.groups, c.kernel[0], c.kernel[1]],
        seed + 1,
    );
    let b = rand_t(&[c.filters], seed + 2);
    let y = k::conv2d_forward(&x, &w, Some(&b), &c).unwrap();
    let r = rand_t(y.dims(), seed + 3);
    let (dx, dw, db) = k::conv2d_backward(&x, &w, &r, &c, true, true, true).unwrap();
    let f = |x: &Tensor, w: &Tensor, b: &Tensor| {
        dot(&k::conv2d_forward(x, w, Some(b), &c).unwrap(), &r)
    };
    let name = format!("conv {c:?} on {input:?}");
    check(&format!("{name} dx"), &x, &dx.unwrap(), |x| f(x, &w, &b));
    check(&format!("{name} dw"), &w, dw.as_ref().unwrap(), |w| {
        f(&x, w, &b)
    });
    check(&format!("{name} db"), &b, &db.unwrap(), |b| f(&x, &w, b));
}

#[test]
fn conv2d_stride1_same_and_valid() {
    conv_case(Conv2d::new(3, 3).same(), [2, 2, 5, 5], 10);
    conv_case(Conv2d::new(2, 3), [2, 3, 5, 6], 20);
    conv_case(Conv2d::new(2, 1), [1, 3, 3, 3], 25);
    // Larger maps take candle's convolution forward and the flipped-kernel input gradient.
    conv_case(Conv2d::new(2, 3).same(), [1, 2, 9, 9], 26);
    conv_case(Conv2d::new(2, 3), [1, 1, 11, 10], 27);
}

#[test]
fn conv2d_strided_and_asymmetric_padding() {
    conv_case(Conv2d::new(2, 3).stride(2), [2, 2, 7, 6], 30);
    // ResNet's projection shortcut: 1x1, stride 2.
    conv_case(Conv2d::new(3, 1).stride(2), [2, 2, 5, 4], 35);
    conv_case(Conv2d::new(2, 7).stride(2), [1, 1, 9, 10], 36);
    // "same" with stride 2 on an even input pads only the bottom/right.
    conv_case(Conv2d::new(2, 3).stride(2).same(), [1, 2, 6, 6], 40);
    conv_case(
        Conv2d::new(2, 2).padding(Padding::Explicit([1, 0, 0, 1])),
        [1, 2, 4, 5],
        50,
    );
}

#[test]
fn conv2d_without_input_gradient_skips_dx() {
    let c = Conv2d::new(2, 3);
    let x = rand_t(&[1, 1, 4, 4], 60);
    let w = rand_t(&[2, 1, 3, 3], 61);
    let g = rand_t(&[1, 2, 2, 2], 62);
    let (dx, _, db) = k::conv2d_backward(&x, &w, &g, &c, false, true, false).unwrap();
    assert!(dx.is_none() && db.is_none());
}

fn pool_case(p: Pool2d, input: [usize; 4], max: bool, seed: u64) {
    let x = rand_t(&input, seed);
    let fwd = |x: &Tensor| {
        if max {
            k::max_pool2d_forward(x, &p).unwrap()
        } else {
            k::avg_pool2d_forward(x, &p).unwrap()
        }
    };
    let y = fwd(&x);
    let r = rand_t(y.dims(), seed + 1);
    let dx = if max {
        k::max_pool2d_backward(&x, &r, &p).unwrap()
    } else {
        k::avg_pool2d_backward(x.dims(), &r, &p).unwrap()
    };
    check(&format!("pool max={max} {p:?}"), &x, &dx, |x| {
        dot(&fwd(x), &r)
    });
}

#[test]
fn max_pool_non_overlapping_overlapping_and_padded() {
    pool_case(Pool2d::new(2, 2), [2, 2, 4, 4], true, 70);
    pool_case(Pool2d::new(3, 2), [1, 2, 7, 7], true, 80);
    let mut p = Pool2d::new(3, 2);
    p.padding = Padding::Same;
    pool_case(p.clone(), [1, 2, 6, 5], true, 90);
    pool_case(p, [1, 2, 6, 5], false, 100);
    pool_case(Pool2d::new(2, 2), [2, 1, 4, 6], false, 110);
}

#[test]
fn max_pool_matches_candle_forward() {
    let x = rand_t(&[2, 3, 6, 6], 120);
    let mut p = Pool2d::new(2, 2);
    let a = k::max_pool2d_forward(&x, &p).unwrap();
    // Explicit zero padding takes the loop path; same result.
    p.padding = Padding::Explicit([0, 0, 0, 0]);
    let b = k::max_pool2d_forward(&x, &p).unwrap();
    assert_eq!(
        a.flatten_all().unwrap().to_vec1::<f64>().unwrap(),
        b.flatten_all().unwrap().to_vec1::<f64>().unwrap()
    );
}

#[test]
fn global_avg_pool() {
    let x = rand_t(&[2, 3, 2, 3], 130);
    let r = rand_t(&[2, 3], 131);
    let dx = k::global_avg_pool_backward(x.dims(), &r).unwrap();
    check("gap", &x, &dx, |x| {
        dot(&k::global_avg_pool_forward(x).unwrap(), &r)
    });
}

#[test]
fn softmax_cross_entropy_from_logits_and_probabilities() {
    let z = rand_t(&[4, 3], 140);
    let labels = Tensor::new(&[0u32, 2, 1, 2], &Device::Cpu).unwrap();
    let mean_loss = |p: &Tensor, logits: bool| {
        k::cross_entropy(p, &labels, logits)
            .unwrap()
            .mean_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    let g = k::cross_entropy_backward(&z, &labels, true).unwrap();
    check("ce logits", &z, &g, |z| mean_loss(z, true));
    // From probabilities the rule gives the gradient at the softmax input.
    let p = k::softmax(&z, 1).unwrap();
    let g = k::cross_entropy_backward(&p, &labels, false).unwrap();
    check("ce probabilities", &z, &g, |z| {
        mean_loss(&k::softmax(z, 1).unwrap(), false)
    });
    // Labels out of range are an error, not a panic.
    let bad = Tensor::new(&[0u32, 3, 1, 2], &Device::Cpu).unwrap();
    assert!(k::cross_entropy_backward(&z, &bad, true).is_err());
}

#[test]
fn f32_kernels_agree_with_f64() {
    let x = rand_t(&[2, 2, 5, 5], 150);
    let w = rand_t(&[3, 2, 3, 3], 151);
    let c = Conv2d::new(3, 3).same();
    let y64 = k::conv2d_forward(&x, &w, None, &c).unwrap();
    let y32 = k::conv2d_forward(
        &x.to_dtype(DType::F32).unwrap(),
        &w.to_dtype(DType::F32).unwrap(),
        None,
        &c,
    )
    .unwrap();
    let d = (y64 - y32.to_dtype(DType::F64).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    assert!(d < 1e-5, "f32 and f64 convolutions differ by {d}");
}

#[test]
fn grouped_depthwise_and_dilated_conv2d() {
    conv_case(Conv2d::new(4, 3).groups(2).same(), [2, 4, 5, 5], 200);
    // MobileNet's depthwise convolutions: stride 1 "same", stride 2 "valid".
    conv_case(Conv2d::depthwise(3, 1, 3).same(), [2, 3, 5, 4], 210);
    conv_case(Conv2d::depthwise(3, 2, 3).stride(2), [1, 3, 7, 7], 220);
    conv_case(Conv2d::new(2, 3).dilation(2).same(), [1, 2, 6, 6], 230);
    let mut c = Conv2d::new(2, 2);
    c.stride = [1, 2];
    conv_case(c, [1, 2, 5, 6], 240);
}

#[test]
fn grouped_conv_matches_candle_forward() {
    let x = rand_t(&[2, 4, 6, 6], 250);
    let w = rand_t(&[6, 2, 3, 3], 251);
    let c = Conv2d::new(6, 3).groups(2).same();
    let ours = k::conv2d_forward(&x, &w, None, &c).unwrap();
    let theirs = x.conv2d(&w, 1, 1, 1, 2).unwrap();
    let d = (ours - theirs)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    assert!(
        d < 1e-12,
        "grouped convolution differs from candle's by {d}"
    );
}

fn conv_transpose_case(c: ConvTranspose2d, input: [usize; 4], seed: u64) {
    let x = rand_t(&input, seed);
    let w = rand_t(&[input[1], c.filters, c.kernel[0], c.kernel[1]], seed + 1);
    let b = rand_t(&[c.filters], seed + 2);
    let y = k::conv_transpose2d_forward(&x, &w, Some(&b), &c).unwrap();
    let r = rand_t(y.dims(), seed + 3);
    let (dx, dw, db) = k::conv_transpose2d_backward(&x, &w, &r, &c, true, true, true).unwrap();
    let f = |x: &Tensor, w: &Tensor, b: &Tensor| {
        dot(&k::conv_transpose2d_forward(x, w, Some(b), &c).unwrap(), &r)
    };
    let name = format!("conv_transpose {c:?} on {input:?}");
    check(&format!("{name} dx"), &x, &dx.unwrap(), |x| f(x, &w, &b));
    check(&format!("{name} dw"), &w, dw.as_ref().unwrap(), |w| {
        f(&x, w, &b)
    });
    check(&format!("{name} db"), &b, &db.unwrap(), |b| f(&x, &w, b));
}

#[test]
fn conv_transpose2d_valid_same_and_cropped() {
    conv_transpose_case(ConvTranspose2d::new(2, 4, 2), [2, 3, 3, 2], 300);
    conv_transpose_case(ConvTranspose2d::new(3, 3, 1), [1, 2, 3, 3], 310);
    let mut c = ConvTranspose2d::new(2, 3, 2);
    c.padding = Padding::Same;
    conv_transpose_case(c.clone(), [1, 2, 3, 3], 320);
    c.padding = Padding::Explicit([1, 0, 0, 2]);
    conv_transpose_case(c, [1, 2, 2, 3], 330);
}

#[test]
fn conv_transpose2d_output_shape_matches_the_models_crate() {
    // FCN8's 16x16 stride-8 upsampling: (in - 1) * 8 + 16.
    let c = ConvTranspose2d::new(2, 16, 8).no_bias();
    let x = rand_t(&[1, 2, 3, 4], 340);
    let w = rand_t(&[2, 2, 16, 16], 341);
    let y = k::conv_transpose2d_forward(&x, &w, None, &c).unwrap();
    assert_eq!(y.dims(), &[1, 2, 32, 40]);
}

#[test]
fn batch_norm_on_images_and_features() {
    for (dims, seed) in [(vec![3, 2, 2, 3], 400u64), (vec![4, 3], 410)] {
        let c = dims[1];
        let x = rand_t(&dims, seed);
        let gamma = rand_t(&[c], seed + 1);
        let beta = rand_t(&[c], seed + 2);
        let r = rand_t(&dims, seed + 3);
        let eps = 1e-3;
        let f = |x: &Tensor, gm: &Tensor, bt: &Tensor| {
            dot(&k::batch_norm_forward(x, gm, bt, eps).unwrap().0, &r)
        };
        let (dx, dg, db) = k::batch_norm_backward(&x, &gamma, &r, eps).unwrap();
        check("bn dx", &x, &dx, |x| f(x, &gamma, &beta));
        check("bn dgamma", &gamma, &dg, |g| f(&x, g, &beta));
        check("bn dbeta", &beta, &db, |b| f(&x, &gamma, b));
    }
}

#[test]
fn batch_norm_statistics_and_running_update() {
    let x = Tensor::new(&[[1f64, 10.0], [3.0, 20.0]], &Device::Cpu).unwrap();
    let ones = Tensor::ones(2, DType::F64, &Device::Cpu).unwrap();
    let zeros = Tensor::zeros(2, DType::F64, &Device::Cpu).unwrap();
    let (y, mean, var) = k::batch_norm_forward(&x, &ones, &zeros, 1e-3).unwrap();
    assert_eq!(mean.to_vec1::<f64>().unwrap(), vec![2.0, 15.0]);
    assert_eq!(var.to_vec1::<f64>().unwrap(), vec![1.0, 25.0]);
    let y = y.to_vec2::<f64>().unwrap();
    assert!((y[0][0] + 1.0 / 1.001f64.sqrt()).abs() < 1e-12);
    let (m, v) = k::batch_norm_running(&zeros, &ones, &mean, &var, 0.9, 2).unwrap();
    let m = m.to_vec1::<f64>().unwrap();
    let v = v.to_vec1::<f64>().unwrap();
    assert!((m[0] - 0.2).abs() < 1e-12 && (m[1] - 1.5).abs() < 1e-12);
    // Unbiased variance: 2.0 and 50.0.
    assert!((v[0] - (0.9 + 0.1 * 2.0)).abs() < 1e-12 && (v[1] - (0.9 + 5.0)).abs() < 1e-12);
}

#[test]
fn layer_norm() {
    let x = rand_t(&[2, 3, 4], 500);
    let gamma = rand_t(&[4], 501);
    let beta = rand_t(&[4], 502);
    let r = rand_t(&[2, 3, 4], 503);
    let eps = 1e-5;
    let f =
        |x: &Tensor, g: &Tensor, b: &Tensor| dot(&k::layer_norm_forward(x, g, b, eps).unwrap(), &r);
    let (dx, dg, db) = k::layer_norm_backward(&x, &gamma, &r, eps).unwrap();
    check("ln dx", &x, &dx, |x| f(x, &gamma, &beta));
    check("ln dgamma", &gamma, &dg, |g| f(&x, g, &beta));
    check("ln dbeta", &beta, &db, |b| f(&x, &gamma, b));
}

#[test]
fn dropout_mask_is_replayed_and_scaled() {
    let seed = k::dropout_seed(42, 3, 7);
    let a = k::dropout_mask(&[4, 50], 0.3, seed, DType::F64, &Device::Cpu).unwrap();
    let b = k::dropout_mask(&[4, 50], 0.3, seed, DType::F64, &Device::Cpu).unwrap();
    let av = a.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    assert_eq!(av, b.flatten_all().unwrap().to_vec1::<f64>().unwrap());
    let dropped = av.iter().filter(|&&v| v == 0.0).count();
    assert!(
        (30..=90).contains(&dropped),
        "{dropped} of 200 dropped at rate 0.3"
    );
    let keep = 1.0 / (1.0 - f64::from(0.3f32));
    assert!(av.iter().all(|&v| v == 0.0 || v == keep));
    // Another step or another layer draws another mask.
    for other in [k::dropout_seed(42, 4, 7), k::dropout_seed(42, 3, 8)] {
        let c = k::dropout_mask(&[4, 50], 0.3, other, DType::F64, &Device::Cpu).unwrap();
        assert_ne!(av, c.flatten_all().unwrap().to_vec1::<f64>().unwrap());
    }
    // The backward rule multiplies by the same mask: check it as a gradient.
    let x = rand_t(&[4, 50], 600);
    let r = rand_t(&[4, 50], 601);
    check("dropout", &x, &r.mul(&a).unwrap(), |x| {
        dot(&x.mul(&a).unwrap(), &r)
    });
}

#[test]
fn embedding_and_position_embedding() {
    let ids = Tensor::new(&[[0u32, 2, 2], [1, 0, 3]], &Device::Cpu).unwrap();
    let w = rand_t(&[4, 5], 700);
    let r = rand_t(&[2, 3, 5], 701);
    let dw = k::embedding_backward(&ids, &w, &r).unwrap();
    check("embedding dw", &w, &dw, |w| {
        dot(&k::embedding_forward(&ids, w).unwrap(), &r)
    });
    let bad = Tensor::new(&[[0u32, 4, 1], [1, 0, 3]], &Device::Cpu).unwrap();
    assert!(k::embedding_forward(&bad, &w).is_err());
    // Position table longer than the sequence: the extra rows get zero gradient.
    let x = rand_t(&[2, 3, 5], 702);
    let pw = rand_t(&[4, 5], 703);
    let dpw = k::position_embedding_backward(&pw, &r).unwrap();
    check("position dw", &pw, &dpw, |pw| {
        dot(&k::position_embedding_forward(&x, pw).unwrap(), &r)
    });
    check("position dx", &x, &r, |x| {
        dot(&k::position_embedding_forward(x, &pw).unwrap(), &r)
    });
}

#[test]
fn self_attention_causal_and_full() {
    let (n, t, c, heads) = (2, 3, 4, 2);
    let x = rand_t(&[n, t, c], 800);
    let wqkv = rand_t(&[3 * c, c], 801);
    let bqkv = rand_t(&[3 * c], 802);
    let wout = rand_t(&[c, c], 803);
    let bout = rand_t(&[c], 804);
    let r = rand_t(&[n, t, c], 805);
    for causal in [true, false] {
        let f = |x: &Tensor, wq: &Tensor, bq: &Tensor, wo: &Tensor, bo: &Tensor| {
            dot(
                &k::attention_forward(x, wq, bq, wo, bo, heads, causal).unwrap(),
                &r,
            )
        };
        let g = k::attention_backward(&x, &wqkv, &bqkv, &wout, &r, heads, causal, true).unwrap();
        let name = format!("attention causal={causal}");
        check(&format!("{name} dx"), &x, &g.dx.unwrap(), |x| {
            f(x, &wqkv, &bqkv, &wout, &bout)
        });
        check(&format!("{name} dwqkv"), &wqkv, &g.dwqkv, |w| {
            f(&x, w, &bqkv, &wout, &bout)
        });
        check(&format!("{name} dbqkv"), &bqkv, &g.dbqkv, |b| {
            f(&x, &wqkv, b, &wout, &bout)
        });
        check(&format!("{name} dwout"), &wout, &g.dwout, |w| {
            f(&x, &wqkv, &bqkv, w, &bout)
        });
        check(&format!("{name} dbout"), &bout, &g.dbout, |b| {
            f(&x, &wqkv, &bqkv, &wout, b)
        });
    }
}

#[test]
fn attention_with_zero_heads_is_an_error() {
    let x = rand_t(&[1, 2, 4], 820);
    let wqkv = rand_t(&[12, 4], 821);
    let b = rand_t(&[12], 822);
    let wout = rand_t(&[4, 4], 823);
    assert!(k::attention_backward(&x, &wqkv, &b, &wout, &x, 0, true, true).is_err());
    assert!(k::attention_backward(&x, &wqkv, &b, &wout, &x, 3, true, true).is_err());
}

#[test]
fn causal_attention_ignores_the_future() {
    let x = rand_t(&[1, 4, 4], 810);
    let wqkv = rand_t(&[12, 4], 811);
    let bqkv = rand_t(&[12], 812);
    let wout = rand_t(&[4, 4], 813);
    let bout = rand_t(&[4], 814);
    let y = k::attention_forward(&x, &wqkv, &bqkv, &wout, &bout, 2, true).unwrap();
    // Change the last token: the first three outputs stay.
    let x2 = Tensor::cat(&[x.narrow(1, 0, 3).unwrap(), rand_t(&[1, 1, 4], 815)], 1).unwrap();
    let y2 = k::attention_forward(&x2, &wqkv, &bqkv, &wout, &bout, 2, true).unwrap();
    let head = |y: &Tensor| {
        y.narrow(1, 0, 3)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
    };
    assert_eq!(head(&y), head(&y2));
}

#[test]
fn per_position_cross_entropy_for_segmentation_and_tokens() {
    // Segmentation: [N, C, positions], classes on axis 1.
    let z = rand_t(&[2, 3, 4], 900);
    let labels = Tensor::new(&[[0u32, 2, 1, 1], [2, 2, 0, 1]], &Device::Cpu).unwrap();
    // Tokens: [N, T, V], classes on axis 2.
    let zt = rand_t(&[2, 3, 4], 910);
    let lt = Tensor::new(&[[0u32, 3, 1], [2, 2, 0]], &Device::Cpu).unwrap();
    for (z, labels, axis) in [(&z, &labels, 1), (&zt, &lt, 2)] {
        let mean_loss = |p: &Tensor, logits: bool| {
            k::cross_entropy_nd(p, labels, axis, logits)
                .unwrap()
                .mean_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
        };
        assert_eq!(
            k::cross_entropy_nd(z, labels, axis, true).unwrap().dims(),
            &[2]
        );
        let g = k::cross_entropy_nd_backward(z, labels, axis, true).unwrap();
        check(&format!("ce axis {axis} logits"), z, &g, |z| {
            mean_loss(z, true)
        });
        let p = k::softmax(z, axis).unwrap();
        let g = k::cross_entropy_nd_backward(&p, labels, axis, false).unwrap();
        check(&format!("ce axis {axis} probabilities"), z, &g, |z| {
            mean_loss(&k::softmax(z, axis).unwrap(), false)
        });
    }
    // Labels of the wrong shape are an error.
    assert!(k::cross_entropy_nd(&z, &lt, 1, true).is_err());
}

#[test]
fn max_pool_ties_send_the_gradient_to_the_first_cell() {
    // Two windows of equal values (as after a ReLU), one with a unique maximum.
    let x = Tensor::new(
        &[[[[0f64, 0.0, 1.0, 2.0], [0.0, 0.0, 3.0, 2.0]]]],
        &Device::Cpu,
    )
    .unwrap();
    let g = Tensor::new(&[[[[5f64, 7.0]]]], &Device::Cpu).unwrap();
    let dx = k::max_pool2d_backward(&x, &g, &Pool2d::new(2, 2)).unwrap();
    assert_eq!(
        dx.flatten_all().unwrap().to_vec1::<f64>().unwrap(),
        vec![5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 7.0, 0.0]
    );
    // Overlapping windows (3x3, stride 2) with padding: gradients of both windows add up.
    let mut p = Pool2d::new(3, 2);
    p.padding = Padding::Same;
    let x = Tensor::new(
        &[[[[1f64, 2.0, 9.0, 0.0], [0.0, 0.0, 0.0, 0.0]]]],
        &Device::Cpu,
    )
    .unwrap();
    let y = k::max_pool2d_forward(&x, &p).unwrap();
    assert_eq!(
        y.flatten_all().unwrap().to_vec1::<f64>().unwrap(),
        vec![9.0, 9.0]
    );
    let g = Tensor::new(&[[[[1f64, 10.0]]]], &Device::Cpu).unwrap();
    let dx = k::max_pool2d_backward(&x, &g, &p).unwrap();
    assert_eq!(
        dx.flatten_all().unwrap().to_vec1::<f64>().unwrap(),
        vec![0.0, 0.0, 11.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    );
}

/// The convolution is bilinear, so for any `r`: `<conv(x, w), r> = <x, dx(r)> = <w, dW(r)>`. On
/// shapes whose unfolded windows span many chunks of the CPU kernel (`conv_cpu::CHUNK_BYTES`),
/// where finite differences would be too slow.
#[test]
fn chunked_convolutions_are_adjoint_to_their_gradients() {
    let cases = [
        (Conv2d::new(8, 3).no_bias().same(), [2, 96, 24, 20]),
        (Conv2d::new(12, 3).no_bias().stride(2), [1, 64, 33, 31]),
        (
            Conv2d::new(8, 3).no_bias().groups(4).dilation(2).same(),
            [2, 128, 20, 20],
        ),
        (
            Conv2d::depthwise(160, 1, 3).no_bias().same(),
            [1, 160, 40, 40],
        ),
    ];
    for (i, (c, input)) in cases.into_iter().enumerate() {
        let geo_rows = input[1] / c.groups * c.kernel[0] * c.kernel[1] * 8;
        let positions = input[2] * input[3];
        assert!(
            positions * geo_rows > 2 * checkmate_executor::conv_cpu::CHUNK_BYTES || c.groups > 1,
            "case {i} must span several chunks"
        );
        let seed = 500 + 10 * i as u64;
        let x = rand_t(&input, seed);
        let w = rand_t(
            &[c.filters, input[1] / c.groups, c.kernel[0], c.kernel[1]],
            seed + 1,
        );
        let y = k::conv2d_forward(&x, &w, None, &c).unwrap();
        let r = rand_t(y.dims(), seed + 2);
        let (dx, dw, _) = k::conv2d_backward(&x, &w, &r, &c, true, true, false).unwrap();
        let yr = dot(&y, &r);
        for (name, got) in [
            ("dx", dot(&x, &dx.unwrap())),
            ("dW", dot(&w, dw.as_ref().unwrap())),
        ] {
            assert!(
                (yr - got).abs() <= 1e-9 * (1.0 + yr.abs()),
                "case {i} {c:?}: <y, r> = {yr}, <{name}, .> = {got}"
            );
        }
    }
}

#[test]
fn chunked_convolution_matches_candle_on_a_large_input() {
    let c = Conv2d::new(16, 3).no_bias().same();
    let x = rand_t(&[2, 64, 30, 30], 600);
    let w = rand_t(&[16, 64, 3, 3], 601);
    let ours = k::conv2d_forward(&x, &w, None, &c).unwrap();
    let theirs = x.conv2d(&w, 1, 1, 1, 1).unwrap();
    let diff = (ours - theirs)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    assert!(diff < 1e-10, "max difference {diff}");
}

#[test]
fn chunked_transposed_convolution_is_adjoint_to_its_gradients() {
    let mut c = ConvTranspose2d::new(24, 3, 2).no_bias();
    c.padding = Padding::Same;
    let x = rand_t(&[2, 96, 16, 16], 610);
    let w = rand_t(&[96, 24, 3, 3], 611);
    let y = k::conv_transpose2d_forward(&x, &w, None, &c).unwrap();
    let r = rand_t(y.dims(), 612);
    let (dx, dw, _) = k::conv_transpose2d_backward(&x, &w, &r, &c, true, true, false).unwrap();
    let yr = dot(&y, &r);
    for (name, got) in [
        ("dx", dot(&x, &dx.unwrap())),
        ("dW", dot(&w, dw.as_ref().unwrap())),
    ] {
        assert!(
            (yr - got).abs() <= 1e-9 * (1.0 + yr.abs()),
            "<y, r> = {yr}, <{name}, .> = {got}"
        );
    }
}

/// The fused ReLU backward of a convolution (mask applied chunk by chunk inside the kernel) equals
/// masking the gradient first and then the plain convolution backward, with and without bias,
/// grouped, on shapes that span several chunks.
#[test]
fn convolution_with_relu_masks_its_gradient_inside_the_kernel() {
    let cases = [
        (Conv2d::new(16, 3).same().relu(), [2, 64, 24, 24]),
        (
            Conv2d::new(12, 3).no_bias().stride(2).relu(),
            [1, 48, 33, 31],
        ),
        (Conv2d::new(8, 3).groups(4).same().relu(), [2, 96, 20, 20]),
    ];
    for (i, (c, input)) in cases.into_iter().enumerate() {
        let seed = 700 + 10 * i as u64;
        let x = rand_t(&input, seed);
        let w = rand_t(
            &[c.filters, input[1] / c.groups, c.kernel[0], c.kernel[1]],
            seed + 1,
        );
        let b = c.bias.then(|| rand_t(&[c.filters], seed + 3));
        let y = k::conv2d_forward_act(&x, &w, b.as_ref(), &c, c.activation).unwrap();
        let g = rand_t(y.dims(), seed + 2);
        let (dx, dw, db) = k::conv2d_backward_relu(&x, &w, &y, &g, &c, true, true, c.bias).unwrap();
        let masked = k::activation_backward(Some(&x), &y, &g, Activation::Relu, 1).unwrap();
        let (dx0, dw0, db0) = k::conv2d_backward(&x, &w, &masked, &c, true, true, c.bias).unwrap();
        let close = |a: &Tensor, b: &Tensor, what: &str| {
            let d = (a - b).unwrap().abs().unwrap().max_all().unwrap();
            let d = d.to_scalar::<f64>().unwrap();
            assert!(d < 1e-10, "case {i} {what}: max difference {d}");
        };
        close(&dx.unwrap(), &dx0.unwrap(), "dx");
        close(dw.as_ref().unwrap(), dw0.as_ref().unwrap(), "dW");
        assert_eq!(db.is_some(), c.bias, "case {i}: bias gradient");
        if let (Some(db), Some(db0)) = (db, db0) {
            close(&db, &db0, "db");
        }
    }
}

/// A recomputed backward node asks for its input gradient only (`need_dw = false`): the input
/// gradient is bitwise the one computed beside the kernel gradient, and no kernel gradient is
/// formed. f32, so that the chunked CPU kernels run (they are what the executor uses).
#[test]
fn skipping_the_kernel_gradient_leaves_the_input_gradient_bitwise_unchanged() {
    let f32t = |dims: &[usize], seed: u64| rand_t(dims, seed).to_dtype(DType::F32).unwrap();
    let same = |a: &Tensor, b: &Tensor, what: &str| {
        let (a, b) = (a.flatten_all().unwrap(), b.flatten_all().unwrap());
        let a = a.to_vec1::<f32>().unwrap();
        let b = b.to_vec1::<f32>().unwrap();
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{what}: input gradients differ"
        );
    };
    for (c, input) in [
        (Conv2d::new(8, 3).same(), [2, 5, 9, 7]),
        (Conv2d::new(6, 3).stride(2).relu(), [2, 4, 11, 10]),
        (Conv2d::new(8, 3).groups(4).same().relu(), [1, 8, 6, 6]),
    ] {
        let x = f32t(&input, 900);
        let w = f32t(
            &[c.filters, input[1] / c.groups, c.kernel[0], c.kernel[1]],
            901,
        );
        let y = k::conv2d_forward_act(&x, &w, None, &c, c.activation).unwrap();
        let g = f32t(y.dims(), 902);
        let (dx, dw, _) = k::conv2d_backward(&x, &w, &g, &c, true, true, false).unwrap();
        let (dx1, dw1, _) = k::conv2d_backward(&x, &w, &g, &c, true, false, false).unwrap();
        assert!(dw.is_some() && dw1.is_none());
        same(&dx.unwrap(), &dx1.unwrap(), "conv");
        let (dx, _, _) = k::conv2d_backward_relu(&x, &w, &y, &g, &c, true, true, false).unwrap();
        let (dx1, dw1, _) =
            k::conv2d_backward_relu(&x, &w, &y, &g, &c, true, false, false).unwrap();
        assert!(dw1.is_none());
        same(&dx.unwrap(), &dx1.unwrap(), "conv + relu");
    }
    let c = ConvTranspose2d::new(2, 4, 2);
    let x = f32t(&[2, 3, 3, 2], 910);
    let w = f32t(&[3, c.filters, c.kernel[0], c.kernel[1]], 911);
    let y = k::conv_transpose2d_forward(&x, &w, None, &c).unwrap();
    let g = f32t(y.dims(), 912);
    let (dx, _, _) = k::conv_transpose2d_backward(&x, &w, &g, &c, true, true, false).unwrap();
    let (dx1, dw1, _) = k::conv_transpose2d_backward(&x, &w, &g, &c, true, false, false).unwrap();
    assert!(dw1.is_none());
    same(&dx.unwrap(), &dx1.unwrap(), "transposed conv");
    let (x, w) = (f32t(&[4, 6], 920), f32t(&[5, 6], 921));
    let g = f32t(&[4, 5], 922);
    let (dx, _, _) = k::dense_backward(&x, &w, &g, true, true).unwrap();
    let (dx1, dw1, _) = k::dense_backward(&x, &w, &g, true, false).unwrap();
    assert!(dw1.is_none());
    same(&dx.unwrap(), &dx1.unwrap(), "dense");
}
