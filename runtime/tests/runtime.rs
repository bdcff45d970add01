//! Runtime tests. Those that need a GPU print `skipped: no GPU (...)` and pass where there is
//! no CUDA driver; on the GPU machine they run for real. GPU tests take a process-wide lock so
//! that they never overlap (one test's stream capture or fault cannot disturb another's), and
//! the test that faults the device on purpose runs in a child process.

use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use sinter_ir::interp::Tensor;
use sinter_ir::{Bindings, BufferData, BufferRole, DType, Dim, Family, Function, GridDim, KernelData, KernelGraph, KernelParam, LaunchPlan, Layout, Target, TensorType};
use sinter_runtime::{probe, CacheKey, CacheStatus, Device, Executor, KernelCache, Lookup, RuntimeError};

static GPU: Mutex<()> = Mutex::new(());

/// The environment variable that tells a child test process which test it runs for its parent.
const CHILD_ENV: &str = "SINTER_RUNTIME_TEST_CHILD";

/// The device and the GPU lock, or `None` (after printing why) where there is no GPU.
fn gpu() -> Option<(MutexGuard<'static, ()>, Device)> {
    match probe() {
        Err(RuntimeError::NoDevice { reason }) => {
            eprintln!("skipped: no GPU ({reason})");
            None
        }
        Err(e) => panic!("probe failed with a device present: {e}"),
        Ok(_) => {
            let guard = GPU.lock().unwrap_or_else(|e| e.into_inner());
            Some((guard, Device::open().expect("opening device 0")))
        }
    }
}

/// Runs the child test `name` of this binary alone in a child process (with `CHILD_ENV` set,
/// without which a child test only says it was skipped).
fn run_child(name: &str, envs: &[(&str, &str)]) -> (bool, String) {
    let exe = std::env::current_exe().expect("test executable");
    let mut cmd = Command::new(exe);
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"]).env(CHILD_ENV, name);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawning the child test");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn is_child(name: &str) -> bool {
    std::env::var(CHILD_ENV).as_deref() == Ok(name)
}

fn bindings(pairs: &[(&str, i64)]) -> Bindings {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

// ------------------------------------------------------------------ hand-written PTX

/// `y[i] = x[i] + 1` over f32 for `i < n` (or `i <= n` when `overrun`, a deliberate bug that
/// writes one element past the end).
fn add_one_ptx(entry: &str, overrun: bool) -> String {
    let cmp = if overrun { "gt" } else { "ge" };
    format!(
        r#".version 7.0
.target sm_80
.address_size 64

.visible .entry {entry}(
    .param .u64 x,
    .param .u64 y,
    .param .u64 n
)
{{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<10>;
    .reg .f32 %f<3>;

    ld.param.u64 %rd1, [x];
    ld.param.u64 %rd2, [y];
    ld.param.u64 %rd3, [n];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.s64 %rd4, %rd4, %rd5;
    setp.{cmp}.s64 %p1, %rd4, %rd3;
    @%p1 bra DONE;
    shl.b64 %rd6, %rd4, 2;
    cvta.to.global.u64 %rd7, %rd1;
    cvta.to.global.u64 %rd8, %rd2;
    add.s64 %rd7, %rd7, %rd6;
    add.s64 %rd8, %rd8, %rd6;
    ld.global.f32 %f1, [%rd7];
    add.f32 %f2, %f1, 0f3F800000;
    st.global.f32 [%rd8], %f2;
DONE:
    ret;
}}
"#
    )
}

fn add_one_plan(entry: &str, overrun: bool) -> LaunchPlan {
    LaunchPlan {
        entry: entry.into(),
        ptx: add_one_ptx(entry, overrun),
        target: Target::SM_80,
        grid: [GridDim { numerator: Dim::symbol("N"), denominator: 256 }, GridDim::fixed(1), GridDim::fixed(1)],
        block: [256, 1, 1],
        shared_bytes: 0,
        params: vec![KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Size(Dim::symbol("N"))],
    }
}

/// Stores 1 to address 0: a guaranteed `CUDA_ERROR_ILLEGAL_ADDRESS`.
const WRITE_NULL_PTX: &str = r#".version 7.0
.target sm_80
.address_size 64

.visible .entry write_null(
    .param .u64 x,
    .param .u64 y,
    .param .u64 n
)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    mov.u64 %rd1, 0;
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
"#;

/// 256 threads fill 64 KiB of dynamic shared memory (`smem[j*256 + t] = t + j` for j < 64),
/// then thread t writes `smem[63*256 + 255 - t]` = `318 - t` to `y[t]`.
const SMEM_PTX: &str = r#".version 7.0
.target sm_80
.address_size 64

.extern .shared .align 16 .b8 smem[];

.visible .entry smem_fill(
    .param .u64 y
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<10>;
    .reg .b64 %rd<5>;
    .reg .f32 %f<2>;

    mov.u32 %r1, %tid.x;
    mov.u32 %r2, 0;
    mov.u32 %r7, smem;
LOOP:
    shl.b32 %r3, %r2, 8;
    add.u32 %r3, %r3, %r1;
    shl.b32 %r4, %r3, 2;
    add.u32 %r5, %r7, %r4;
    add.u32 %r6, %r1, %r2;
    cvt.rn.f32.u32 %f1, %r6;
    st.shared.f32 [%r5], %f1;
    add.u32 %r2, %r2, 1;
    setp.lt.u32 %p1, %r2, 64;
    @%p1 bra LOOP;
    bar.sync 0;
    mov.u32 %r8, 16383;
    sub.u32 %r3, %r8, %r1;
    shl.b32 %r4, %r3, 2;
    add.u32 %r5, %r7, %r4;
    ld.shared.f32 %f1, [%r5];
    ld.param.u64 %rd1, [y];
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.f32 [%rd4], %f1;
    ret;
}
"#;

fn smem_plan(shared_bytes: u32) -> LaunchPlan {
    LaunchPlan {
        entry: "smem_fill".into(),
        ptx: SMEM_PTX.into(),
        target: Target::SM_80,
        grid: [GridDim::fixed(1), GridDim::fixed(1), GridDim::fixed(1)],
        block: [256, 1, 1],
        shared_bytes,
        params: vec![KernelParam::Buffer(0)],
    }
}

/// A kernel graph of `plans.len()` pointwise kernels chained over f32[N]: x → t0 → t1 → … → y,
/// each kernel taking one buffer and writing the next.
fn chain_graph(kernels: usize) -> KernelGraph {
    let mut g = KernelGraph::default();
    let shape = vec![Dim::symbol("N")];
    let ty = TensorType::new(DType::F32, shape.clone());
    let mut prev = g.buffers.push(BufferData { name: Some("x".into()), ty: ty.clone(), role: BufferRole::Input, layout: Layout::contiguous(&shape) });
    g.inputs.push(prev);
    for i in 0..kernels {
        let last = i + 1 == kernels;
        let next = g.buffers.push(BufferData {
            name: last.then(|| "y".to_string()),
            ty: ty.clone(),
            role: if last { BufferRole::Output } else { BufferRole::Temp },
            layout: Layout::contiguous(&shape),
        });
        g.kernels.push(KernelData { family: Family::Pointwise, body: Function::new(format!("k{i}")), inputs: vec![prev], outputs: vec![next] });
        prev = next;
    }
    g.outputs.push(prev);
    g
}

// ------------------------------------------------------------------ tests without a GPU

#[test]
fn handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Device>();
    send_sync::<sinter_runtime::DeviceBuffer>();
    send_sync::<Executor>();
    send_sync::<KernelCache>();
    send_sync::<RuntimeError>();
}

#[test]
fn probe_reports_no_device_without_panicking() {
    match probe() {
        Err(e @ RuntimeError::NoDevice { .. }) => {
            let msg = e.to_string();
            assert!(msg.starts_with("no CUDA device: "), "{msg}");
            eprintln!("probe: {msg}");
            // Opening a device fails the same way.
            let err = Device::open().map(|_| ()).unwrap_err();
            assert!(err.is_no_device(), "{err}");
        }
        Err(e) => panic!("probe failed with something other than NoDevice: {e}"),
        Ok(info) => {
            eprintln!("probe: {info}");
            assert!(!info.name.is_empty());
            assert!(info.sm_count > 0 && info.total_memory > 0);
            assert!(info.sm().starts_with("sm_"));
            assert!(info.driver_version.0 >= 11, "{info:?}");
        }
    }
}

#[test]
fn sinter_no_gpu_forces_no_device() {
    let (ok, out) = run_child("child_no_gpu_env", &[("SINTER_NO_GPU", "1")]);
    assert!(ok && out.contains("CHILD-OK"), "{out}");
}

#[test]
fn child_no_gpu_env() {
    if !is_child("child_no_gpu_env") {
        eprintln!("skipped here: runs as the child process of sinter_no_gpu_forces_no_device");
        return;
    }
    let err = probe().unwrap_err();
    assert!(err.to_string().contains("SINTER_NO_GPU is set"), "{err}");
    assert!(Device::open().unwrap_err().is_no_device());
    println!("CHILD-OK");
}

#[test]
fn cached_plan_survives_the_trip_and_corruption_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(dir.path()).unwrap();
    let key = CacheKey::new("func @k0 ...", "block=256", "sm_80", "7.0", "22.1.8");
    let plan = add_one_plan("add_one", false);
    let (p, s) = cache.get_or_build(&key, || Ok::<_, RuntimeError>(plan.clone())).unwrap();
    assert_eq!((p, s), (plan.clone(), CacheStatus::Built));
    assert_eq!(cache.get(&key), Lookup::Hit(plan.clone()));
    // Cut the entry in half: detected, reported, rebuilt.
    let path = cache.entry_path(&key);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let (p, s) = cache.get_or_build(&key, || Ok::<_, RuntimeError>(plan.clone())).unwrap();
    assert_eq!(p, plan);
    match s {
        CacheStatus::Rebuilt { reason } => assert!(reason.contains(".plan"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn hand_written_ptx_assembles_with_ptxas_if_present() {
    // The GPU tests' PTX must be right before it reaches the GPU machine: check it with ptxas
    // where the project's setup put it (skipped elsewhere; the GPU tests would then tell).
    let ptxas = std::env::var_os("PTXAS").map(std::path::PathBuf::from).or_else(|| {
        let p = std::path::PathBuf::from(std::env::var_os("HOME")?).join(".cache/sinter/bin/ptxas");
        p.exists().then_some(p)
    });
    let Some(ptxas) = ptxas else {
        eprintln!("skipped: no ptxas");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for (name, ptx) in [("add", add_one_ptx("add_one", false)), ("over", add_one_ptx("add_over", true)), ("null", WRITE_NULL_PTX.to_string()), ("smem", SMEM_PTX.to_string())] {
        let src = dir.path().join(format!("{name}.ptx"));
        std::fs::write(&src, ptx).unwrap();
        let out = Command::new(&ptxas).arg("-arch=sm_80").arg(&src).arg("-o").arg(dir.path().join(format!("{name}.cubin"))).output().unwrap();
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

// ------------------------------------------------------------------ GPU tests

#[test]
fn gpu_add_one_through_a_launch_plan() {
    let Some((_lock, dev)) = gpu() else { return };
    eprintln!("{}", dev.info());
    for n in [1usize, 255, 256, 1000, 100_003] {
        let xs: Vec<f64> = (0..n).map(|i| i as f64 * 0.5 - 7.0).collect();
        let x = dev.upload_f64(DType::F32, &[n], &xs).unwrap();
        let y = dev.alloc(DType::F32, &[n]).unwrap();
        dev.launch(&add_one_plan("add_one", false), &[&x, &y], &bindings(&[("N", n as i64)])).unwrap();
        let ys = dev.download_f64(&y).unwrap();
        for (i, (a, b)) in xs.iter().zip(&ys).enumerate() {
            assert_eq!(*b, DType::F32.round(a + 1.0), "n={n} i={i}");
        }
    }
    let k = dev.load(&add_one_plan("add_one", false)).unwrap();
    let a = k.attributes();
    eprintln!("add_one: {a:?}");
    assert_eq!(a.local_bytes, 0, "no spills");
    assert!(a.registers > 0 && a.max_threads_per_block >= 256);
    // Loading again returns the cached kernel.
    assert!(std::sync::Arc::ptr_eq(&k, &dev.load(&add_one_plan("add_one", false)).unwrap()));
}

#[test]
fn gpu_upload_download_every_dtype() {
    let Some((_lock, dev)) = gpu() else { return };
    let values = [0.0, -0.0, 1.0, -1.5, std::f64::consts::PI, 65520.0, 1e39, -1e39, f64::INFINITY, f64::NEG_INFINITY, 2.5e9, -7.9, 1e-9, 42.0, 0.1, -3.0];
    for dtype in DType::ALL.into_iter().filter(|d| !d.is_quantized()) {
        for shape in [vec![16usize], vec![4, 4], vec![2, 2, 4]] {
            let b = dev.upload_f64(dtype, &shape, &values).unwrap();
            assert_eq!(b.dtype(), dtype);
            assert_eq!(b.shape(), &shape[..]);
            assert_eq!(b.len_bytes(), 16 * dtype.size_bytes());
            assert_eq!(b.device_ptr() % 256, 0);
            let back = dev.download_f64(&b).unwrap();
            let want: Vec<f64> = values.iter().map(|x| dtype.round(*x)).collect();
            assert_eq!(back, want, "{dtype}");
            // Through the interpreter's Tensor both ways.
            let t = Tensor::new(dtype, &shape, values.to_vec()).unwrap();
            let tb = dev.upload_tensor(&t).unwrap();
            assert_eq!(dev.download_tensor(&tb).unwrap(), t, "{dtype}");
        }
    }
    // NaN survives float dtypes.
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        let b = dev.upload_f64(dtype, &[1], &[f64::NAN]).unwrap();
        assert!(dev.download_f64(&b).unwrap()[0].is_nan(), "{dtype}");
    }
    // Typed helpers.
    let bf = vec![half::bf16::from_f32(1.5), half::bf16::from_f32(-2.25)];
    let b = dev.upload(&[2], &bf).unwrap();
    assert_eq!(dev.download::<half::bf16>(&b).unwrap(), bf);
    assert!(matches!(dev.download::<f32>(&b), Err(RuntimeError::Buffer(_))));
    let flags = vec![true, false, true];
    let b = dev.upload(&[3], &flags).unwrap();
    assert_eq!(dev.download::<bool>(&b).unwrap(), flags);
    let ids = vec![i64::MIN, -1, 0, i64::MAX];
    let b = dev.upload(&[4], &ids).unwrap();
    assert_eq!(dev.download::<i64>(&b).unwrap(), ids);
    // Empty tensors and wrong lengths.
    let e = dev.upload_f64(DType::F32, &[0, 5], &[]).unwrap();
    assert_eq!(dev.download_f64(&e).unwrap(), Vec::<f64>::new());
    assert!(matches!(dev.upload_f64(DType::F32, &[3], &[1.0]), Err(RuntimeError::Buffer(_))));
    // Overwrite in place and zero-fill.
    let b = dev.upload_f64(DType::I32, &[3], &[1.0, 2.0, 3.0]).unwrap();
    dev.write_f64(&b, &[7.0, 8.0, 9.0]).unwrap();
    assert_eq!(dev.download_f64(&b).unwrap(), vec![7.0, 8.0, 9.0]);
    assert_eq!(dev.download_f64(&dev.alloc_zeroed(DType::BF16, &[5]).unwrap()).unwrap(), vec![0.0; 5]);
}

#[test]
fn gpu_guard_tail_catches_writes_past_the_extent() {
    let Some((_lock, dev)) = gpu() else { return };
    let n = 1000usize;
    let x = dev.upload_f64(DType::F32, &[n + 1], &vec![1.0; n + 1]).unwrap();
    for (entry, overrun) in [("add_one", false), ("add_over", true)] {
        let y = dev.alloc_with_guard(DType::F32, &[n], 64).unwrap();
        assert!(y.guard_bytes() >= 64);
        dev.poison(&y, 0xA5).unwrap();
        dev.launch(&add_one_plan(entry, overrun), &[&x, &y], &bindings(&[("N", n as i64)])).unwrap();
        let v = dev.guard_violation(&y, 0xA5).unwrap();
        if overrun {
            let v = v.expect("the overrun must be seen");
            assert_eq!(v.offset, n * 4, "{v}");
            assert_eq!(v.changed, 4, "{v}");
        } else {
            assert_eq!(v, None);
            assert_eq!(dev.download_f64(&y).unwrap(), vec![2.0; n]);
        }
    }
}

#[test]
fn gpu_dynamic_shared_memory_above_48_kib() {
    let Some((_lock, dev)) = gpu() else { return };
    let y = dev.alloc(DType::F32, &[256]).unwrap();
    dev.launch(&smem_plan(64 * 1024), &[&y], &Bindings::new()).unwrap();
    let want: Vec<f64> = (0..256).map(|t| (318 - t) as f64).collect();
    assert_eq!(dev.download_f64(&y).unwrap(), want);
    // More than the device allows is refused before the driver sees it.
    let too_much = dev.info().max_shared_per_block_optin + 1;
    let err = dev.launch(&smem_plan(too_much), &[&y], &Bindings::new()).unwrap_err();
    assert!(matches!(err, RuntimeError::InvalidLaunch { .. }), "{err}");
}

/// Each CTA of a cluster of 16 (more than the portable 8: the loader must allow it) writes
/// its rank and its cluster's size: `y[cta] = rank + 100 · size`.
const CLUSTER16_PTX: &str = r#".version 7.8
.target sm_90
.address_size 64

.visible .entry cluster16(
    .param .u64 y
)
.reqnctapercluster 16, 1, 1
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<4>;
    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p1, %r1, 0;
    barrier.cluster.arrive;
    barrier.cluster.wait;
    @%p1 bra DONE;
    mov.u32 %r2, %cluster_ctarank;
    mov.u32 %r3, %cluster_nctarank;
    mad.lo.u32 %r4, %r3, 100, %r2;
    cvt.rn.f32.u32 %r5, %r4;
    mov.u32 %r1, %ctaid.x;
    ld.param.u64 %rd1, [y];
    cvta.to.global.u64 %rd1, %rd1;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.f32 [%rd3], %r5;
DONE:
    ret;
}
"#;

#[test]
fn gpu_cluster_of_16_ctas_launches() {
    let Some((_lock, dev)) = gpu() else { return };
    if dev.info().compute_capability.0 < 9 {
        eprintln!("skipped: thread-block clusters need sm_90, this is {}", dev.info().sm());
        return;
    }
    let plan = LaunchPlan {
        entry: "cluster16".into(),
        ptx: CLUSTER16_PTX.into(),
        target: Target::SM_90,
        grid: [GridDim::fixed(48), GridDim::fixed(1), GridDim::fixed(1)],
        block: [64, 1, 1],
        shared_bytes: 0,
        params: vec![KernelParam::Buffer(0)],
    };
    let k = dev.load(&plan).unwrap();
    assert_eq!(k.attributes().cluster_size, 16);
    let y = dev.alloc(DType::F32, &[48]).unwrap();
    dev.launch(&plan, &[&y], &Bindings::new()).unwrap();
    dev.synchronize().unwrap();
    let want: Vec<f64> = (0..48).map(|c| (1600 + c % 16) as f64).collect();
    assert_eq!(dev.download_f64(&y).unwrap(), want);
    // Plain kernels have no cluster.
    assert_eq!(dev.load(&add_one_plan("add_one", false)).unwrap().attributes().cluster_size, 1);
}

#[test]
fn gpu_bad_ptx_and_bad_plans_are_errors() {
    let Some((_lock, dev)) = gpu() else { return };
    let mut bad = add_one_plan("add_one", false);
    bad.ptx = bad.ptx.replace("add.f32", "add.f99");
    match dev.load(&bad) {
        Err(RuntimeError::Jit { entry, code, log }) => {
            assert_eq!(entry, "add_one");
            assert!(code.starts_with("CUDA_ERROR_"), "{code}");
            eprintln!("JIT said ({code}): {log}");
            assert!(!log.is_empty());
        }
        other => panic!("{other:?}"),
    }
    let mut missing = add_one_plan("add_one", false);
    missing.entry = "nope".into();
    assert!(matches!(dev.load(&missing), Err(RuntimeError::Jit { .. })));
    // A plan for a target this device cannot run (sm_90 on an A100, sm_90a on anything but
    // sm_90; none on an H100/H200) is refused before the driver sees it.
    if let Some(t) = Target::ALL.into_iter().find(|t| !t.runs_on(dev.info().compute_capability)) {
        let mut other = add_one_plan("add_one", false);
        other.target = t;
        assert!(matches!(dev.load(&other), Err(RuntimeError::InvalidLaunch { .. })));
    }
    let x = dev.alloc(DType::F32, &[4]).unwrap();
    let err = dev.launch(&add_one_plan("add_one", false), &[&x], &bindings(&[("N", 4)])).unwrap_err();
    assert!(matches!(err, RuntimeError::InvalidLaunch { .. }), "{err}");
    let err = dev.launch(&add_one_plan("add_one", false), &[&x, &x], &Bindings::new()).unwrap_err();
    assert!(matches!(err, RuntimeError::Dim { .. }), "{err}");
    // The device is still healthy.
    dev.synchronize().unwrap();
}

#[test]
fn gpu_pool_reuses_and_reports_out_of_memory() {
    let Some((_lock, dev)) = gpu() else { return };
    let a = dev.alloc(DType::F32, &[1000]).unwrap();
    let ptr = a.device_ptr();
    drop(a);
    let before = dev.pool_stats();
    let b = dev.alloc(DType::BF16, &[2000]).unwrap(); // 4000 bytes: the same 4 KiB class
    assert_eq!(b.device_ptr(), ptr);
    assert_eq!(dev.pool_stats().reuses, before.reuses + 1);
    match dev.alloc(DType::F32, &[1usize << 40]) {
        Err(RuntimeError::OutOfMemory { requested, free }) => {
            assert!(requested >= 4 << 40);
            assert!(free < requested);
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    // Still usable afterwards.
    let c = dev.upload_f64(DType::F32, &[3], &[1.0, 2.0, 3.0]).unwrap();
    assert_eq!(dev.download_f64(&c).unwrap(), vec![1.0, 2.0, 3.0]);
    assert!(dev.trim_pool().is_ok());
}

#[test]
fn gpu_executor_runs_a_graph_profiles_and_checks_guards() {
    let Some((_lock, dev)) = gpu() else { return };
    let g = chain_graph(3);
    let plans = vec![add_one_plan("add_one", false); 3];
    let exec = Executor::new(&dev, &g, plans).unwrap().with_output_guard(256, 0xEE);
    let n = 4099usize;
    let xs: Vec<f64> = (0..n).map(|i| (i % 97) as f64).collect();
    let x = dev.upload_f64(DType::F32, &[n], &xs).unwrap();
    // N is bound from x's shape.
    let out = exec.run(&[&x], &Bindings::new()).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].shape(), &[n]);
    let want: Vec<f64> = xs.iter().map(|v| v + 3.0).collect();
    assert_eq!(dev.download_f64(&out[0]).unwrap(), want);
    assert_eq!(dev.guard_violation(&out[0], 0xEE).unwrap(), None);
    // By name, and profiled.
    let out = exec.run_named(&[("x", &x)], &Bindings::new()).unwrap();
    assert_eq!(dev.download_f64(&out[0]).unwrap(), want);
    let (out, profile) = exec.run_profiled(&[&x], &Bindings::new()).unwrap();
    assert_eq!(dev.download_f64(&out[0]).unwrap(), want);
    eprintln!("{profile}");
    assert_eq!(profile.kernels.len(), 3);
    assert!(profile.kernels.iter().all(|k| k.micros > 0.0 && k.entry == "add_one"));
    assert!(profile.total_micros >= profile.kernels[0].micros);
    // Wrong inputs are errors.
    let wrong = dev.upload_f64(DType::BF16, &[n], &xs).unwrap();
    assert!(matches!(exec.run(&[&wrong], &Bindings::new()), Err(RuntimeError::Buffer(_))));
    assert!(matches!(exec.run(&[&x], &bindings(&[("N", 7)])), Err(RuntimeError::Buffer(_))));
    assert!(matches!(exec.run_named(&[("z", &x)], &Bindings::new()), Err(RuntimeError::Graph(_))));
    assert!(matches!(Executor::new(&dev, &g, vec![add_one_plan("add_one", false)]), Err(RuntimeError::Graph(_))));
}

#[test]
fn gpu_cuda_graph_capture_and_replay() {
    let Some((_lock, dev)) = gpu() else { return };
    let g = chain_graph(4);
    let exec = Executor::new(&dev, &g, vec![add_one_plan("add_one", false); 4]).unwrap();
    let n = 3000usize;
    let x = dev.upload_f64(DType::F32, &[n], &vec![0.0; n]).unwrap();
    let graph = exec.capture(&[&x], &Bindings::new()).unwrap();
    assert_eq!(graph.kernel_count(), 4);
    assert_eq!(graph.bindings().get("N"), Some(&(n as i64)));
    // Capturing ran nothing: the captured output is whatever the pool had. Replay runs it.
    for step in 0..5 {
        let xs: Vec<f64> = (0..n).map(|i| (i + step * 10) as f64).collect();
        dev.write_f64(&x, &xs).unwrap();
        graph.replay().unwrap();
        let got = dev.download_f64(&graph.outputs()[0]).unwrap();
        let want: Vec<f64> = xs.iter().map(|v| v + 4.0).collect();
        assert_eq!(got, want, "step {step}");
        // The same as an eager run.
        let eager = exec.run(&[&x], &Bindings::new()).unwrap();
        assert_eq!(dev.download_f64(&eager[0]).unwrap(), want);
    }
}

#[test]
fn gpu_plan_from_the_kernel_cache_runs() {
    let Some((_lock, dev)) = gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::new(dir.path()).unwrap();
    let key = CacheKey { driver_version: Some(format!("{:?}", dev.info().driver_version)), ..CacheKey::new("ir", "s", "sm_80", "7.0", "none") };
    cache.put(&key, &add_one_plan("add_one", false)).unwrap();
    let Lookup::Hit(plan) = cache.get(&key) else { panic!("miss") };
    let x = dev.upload_f64(DType::F32, &[10], &[1.0; 10]).unwrap();
    let y = dev.alloc(DType::F32, &[10]).unwrap();
    dev.launch(&plan, &[&x, &y], &bindings(&[("N", 10)])).unwrap();
    assert_eq!(dev.download_f64(&y).unwrap(), vec![2.0; 10]);
}

/// A faulting kernel poisons the whole CUDA context (sticky error), so it runs in a child
/// process of its own.
#[test]
fn gpu_illegal_address_names_the_error_and_the_kernel() {
    let Some((lock, _dev)) = gpu() else { return };
    let (ok, out) = run_child("child_illegal_address", &[]);
    drop(lock);
    assert!(ok, "child failed:\n{out}");
    assert!(out.contains("CHILD-OK") && out.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{out}");
}

#[test]
fn child_illegal_address() {
    if !is_child("child_illegal_address") {
        eprintln!("skipped here: runs as the child process of gpu_illegal_address_names_the_error_and_the_kernel");
        return;
    }
    let dev = Device::open().expect("device in child");
    let g = chain_graph(2);
    let mut bad = add_one_plan("write_null", false);
    bad.ptx = WRITE_NULL_PTX.into();
    let exec = Executor::new(&dev, &g, vec![add_one_plan("add_one", false), bad]).unwrap().checked(true);
    let x = dev.upload_f64(DType::F32, &[64], &[1.0; 64]).unwrap();
    let err = exec.run(&[&x], &Bindings::new()).unwrap_err();
    println!("error: {err}");
    assert_eq!(err.cuda_code(), Some("CUDA_ERROR_ILLEGAL_ADDRESS"), "{err}");
    match &err {
        // Checked mode synchronised after add_one, so only write_null is pending.
        RuntimeError::Cuda { kernel, .. } => assert_eq!(kernel.as_deref(), Some("write_null"), "{err}"),
        other => panic!("{other:?}"),
    }
    println!("CHILD-OK {}", err.cuda_code().unwrap_or_default());
}
