//! Every backward rule against central finite differences in f64 on small random inputs.

use candle_core::{DType, Device, Tensor};
use checkmate_executor::kernels as k;
use checkmate_models::{Activation, Conv2d, Padding, Pool2d};
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
        let (dx, dw, db) = k::dense_backward(&x, &w, &g, true).unwrap();
        let name = act.name();
        check(&format!("dense {name} dx"), &x, &dx.unwrap(), |x| {
            dot(&fwd(x, &w, &b), &r)
        });
        check(&format!("dense {name} dw"), &w, &dw, |w| {
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
    let (dx, dw, _) = k::dense_backward(&x, &w, &r, true).unwrap();
    check("dense3 dx", &x, &dx.unwrap(), |x| {
        dot(&k::dense_forward(x, &w, None).unwrap(), &r)
    });
    check("dense3 dw", &w, &dw, |w| {
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
    let w = rand_t(&[c.filters, input[1], c.kernel[0], c.kernel[1]], seed + 1);
    let b = rand_t(&[c.filters], seed + 2);
    let y = k::conv2d_forward(&x, &w, Some(&b), &c).unwrap();
    let r = rand_t(y.dims(), seed + 3);
    let (dx, dw, db) = k::conv2d_backward(&x, &w, &r, &c, true, true).unwrap();
    let f = |x: &Tensor, w: &Tensor, b: &Tensor| {
        dot(&k::conv2d_forward(x, w, Some(b), &c).unwrap(), &r)
    };
    let name = format!("conv {c:?} on {input:?}");
    check(&format!("{name} dx"), &x, &dx.unwrap(), |x| f(x, &w, &b));
    check(&format!("{name} dw"), &w, &dw, |w| f(&x, w, &b));
    check(&format!("{name} db"), &b, &db.unwrap(), |b| f(&x, &w, b));
}

#[test]
fn conv2d_stride1_same_and_valid() {
    conv_case(Conv2d::new(3, 3).same(), [2, 2, 5, 5], 10);
    conv_case(Conv2d::new(2, 3), [2, 3, 5, 6], 20);
    conv_case(Conv2d::new(2, 1), [1, 3, 3, 3], 25);
}

#[test]
fn conv2d_strided_and_asymmetric_padding() {
    conv_case(Conv2d::new(2, 3).stride(2), [2, 2, 7, 6], 30);
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
    let (dx, _, db) = k::conv2d_backward(&x, &w, &g, &c, false, false).unwrap();
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
        k::avg_pool2d_backward(&x, &r, &p).unwrap()
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
    let dx = k::global_avg_pool_backward(&x, &r).unwrap();
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
