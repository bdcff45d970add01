//! A CPU emulator for the tests: runs a kernel's LLVM IR (as built, before the NVPTX back
//! end; [`crate::isa::kit::EMIT_IR`]) on the host and compares it with the interpreter.
//!
//! The IR is rewritten for the host — address spaces dropped, the PTX calling convention
//! dropped, NVVM intrinsics (special registers, `bar.sync`, `bar.warp.sync`,
//! `shfl.sync.bfly`, `ex2.approx`) and bf16 conversions turned into calls of the functions
//! below — and compiled with MCJIT. CTAs run one after another (the kernel's shared memory is
//! one global); the threads of a CTA run as OS threads, with `std::sync::Barrier`s for the
//! CTA barrier and for each warp (shuffles exchange values through per-warp slots). A kernel
//! with a thread-block cluster (`"nvvm.cluster_dim"`) runs a cluster at a time: the module is
//! compiled once per CTA of the cluster, so each CTA has its own shared memory, all their
//! threads run at once, `mapa.shared::cluster` maps an address into another CTA's copy,
//! `barrier.cluster.wait` is a barrier of every thread of the cluster (an arrive is a no-op,
//! which is stricter, never looser), and `%cluster_ctarank` is the CTA's rank. This
//! checks the generators' index arithmetic, masking, tiling and synchronisation structure on
//! edge cases; it does not check the NVPTX back end or ptxas (ptxas assembles every kernel
//! in the other tests) nor the device's `ex2.approx` (the host's `exp2` stands in).
//!
//! Built for this crate's tests, and with the `emu` feature for tests outside it.
//!
//! Design notes: book/src/design/matmul.md

// Test support (the tests' emulator, the fuzzer's CPU runs): a failure is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};

use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::targets::{InitializationConfig, Target as LlvmTarget};
use inkwell::OptimizationLevel;
use sinter_ir::interp::{self, Tensor};
use sinter_ir::{Bindings, DType, Graph, Kernel, KernelGraph, KernelParam, LaunchPlan};

use crate::isa::kit::EMIT_IR;

pub mod graph;
pub mod persistent;
use crate::error::CodegenError;

struct Warp {
    barrier: Barrier,
    slots: [AtomicU32; 32],
    /// Two buffers of [`XCHG`] words per lane for the warp-collective tensor-core
    /// instructions (`ldmatrix`, `mma`), used alternately: a lane writes its part into
    /// buffer `n mod 2` of its `n`-th collective, waits on the warp barrier, then reads
    /// the others'. A lane can only write that buffer again two collectives later, after
    /// every lane has passed the barrier of the collective in between, so one barrier per
    /// collective suffices.
    xchg: [Vec<AtomicU32>; 2],
}

/// Words per lane in a warp's exchange buffers: an `mma`'s A (4), B (2) and C (4).
const XCHG: usize = 10;

struct Cta {
    barrier: Barrier,
    warps: Vec<Warp>,
    /// Counted barriers (`barrier.cta.sync.aligned.count id, n`), by id and count.
    counted: std::sync::Mutex<std::collections::HashMap<(i32, i32), Arc<Barrier>>>,
}

/// The CTAs of a thread-block cluster running together.
struct Cluster {
    /// Every thread of the cluster (`barrier.cluster.wait`, and between clusters).
    barrier: Barrier,
    /// Per rank: the address ranges `(start, bytes)` of that CTA's shared-memory globals,
    /// in one order for every rank.
    shared: Vec<Vec<(usize, usize)>>,
}

struct ThreadCtx {
    tid: u32,
    ntid: u32,
    ctaid: [u32; 3],
    nctaid: [u32; 3],
    cta: Arc<Cta>,
    /// The CTA's rank in its cluster.
    rank: u32,
    cluster: Arc<Cluster>,
}

/// One 16-byte `cp.async` copy: destination and source addresses and the bytes read.
#[derive(Clone, Copy)]
struct AsyncCopy {
    dst: usize,
    src: usize,
    bytes: u32,
}

/// A thread's `cp.async` state: committed groups not yet waited for (oldest first) and
/// the copies issued since the last commit.
#[derive(Default)]
struct AsyncState {
    committed: std::collections::VecDeque<Vec<AsyncCopy>>,
    open: Vec<AsyncCopy>,
}

thread_local! {
    static CTX: RefCell<Option<ThreadCtx>> = const { RefCell::new(None) };
    /// The collectives this thread has executed (its exchange-buffer parity).
    static COLLECTIVES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// The registers the last `ldmatrix` or `mma` returned (read by `emu_frag_*`).
    static FRAG: std::cell::Cell<[u32; 4]> = const { std::cell::Cell::new([0; 4]) };
    static ASYNC: RefCell<AsyncState> = RefCell::new(AsyncState::default());
}

fn with<T>(f: impl FnOnce(&ThreadCtx) -> T) -> T {
    CTX.with(|c| f(c.borrow().as_ref().expect("an emulated thread")))
}

extern "C" fn emu_tid_x() -> i32 {
    with(|c| c.tid as i32)
}
extern "C" fn emu_ntid_x() -> i32 {
    with(|c| c.ntid as i32)
}
extern "C" fn emu_ctaid_x() -> i32 {
    with(|c| c.ctaid[0] as i32)
}
extern "C" fn emu_ctaid_y() -> i32 {
    with(|c| c.ctaid[1] as i32)
}
extern "C" fn emu_ctaid_z() -> i32 {
    with(|c| c.ctaid[2] as i32)
}
extern "C" fn emu_nctaid_x() -> i32 {
    with(|c| c.nctaid[0] as i32)
}
extern "C" fn emu_nctaid_y() -> i32 {
    with(|c| c.nctaid[1] as i32)
}
extern "C" fn emu_nctaid_z() -> i32 {
    with(|c| c.nctaid[2] as i32)
}
extern "C" fn emu_barrier(_: i32) {
    let cta = with(|c| c.cta.clone());
    cta.barrier.wait();
}
/// `barrier.cta.sync.aligned.count id, n` (`bar.sync id, n`): the first `n` threads that
/// arrive at barrier `id` (the emulated kernels use it for a CTA's first `n` threads).
extern "C" fn emu_barrier_count(id: i32, n: i32) {
    let cta = with(|c| c.cta.clone());
    let b = cta.counted.lock().unwrap().entry((id, n)).or_insert_with(|| Arc::new(Barrier::new(n.max(1) as usize))).clone();
    b.wait();
}
/// `%globaltimer`: nanoseconds of the host's monotonic clock since the first read.
extern "C" fn emu_globaltimer() -> i64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed().as_nanos() as i64
}
extern "C" fn emu_warp_sync(_: i32) {
    let (cta, w) = with(|c| (c.cta.clone(), c.tid / 32));
    cta.warps[w as usize].barrier.wait();
}
/// `shfl.sync.bfly.b32`: the 32 bits of lane `lane ^ lane_mask`.
fn shfl_bits(v: u32, lane_mask: i32) -> u32 {
    let (cta, tid) = with(|c| (c.cta.clone(), c.tid));
    let warp = &cta.warps[(tid / 32) as usize];
    let lane = (tid % 32) as usize;
    warp.slots[lane].store(v, Ordering::SeqCst);
    warp.barrier.wait();
    let r = warp.slots[lane ^ (lane_mask as usize & 31)].load(Ordering::SeqCst);
    warp.barrier.wait();
    r
}
extern "C" fn emu_shfl(_: i32, v: f32, lane_mask: i32, _: i32) -> f32 {
    f32::from_bits(shfl_bits(v.to_bits(), lane_mask))
}
extern "C" fn emu_shfl_i32(_: i32, v: i32, lane_mask: i32, _: i32) -> i32 {
    shfl_bits(v as u32, lane_mask) as i32
}
/// `vote.sync.any.pred`: the `i1` arrives in bit 0 of a byte (the rest undefined).
extern "C" fn emu_vote_any(_: i32, p: u8) -> u8 {
    let (cta, tid) = with(|c| (c.cta.clone(), c.tid));
    let warp = &cta.warps[(tid / 32) as usize];
    warp.slots[(tid % 32) as usize].store(u32::from(p & 1), Ordering::SeqCst);
    warp.barrier.wait();
    let any = warp.slots.iter().any(|s| s.load(Ordering::SeqCst) != 0);
    warp.barrier.wait();
    u8::from(any)
}
extern "C" fn emu_cluster_ctarank() -> i32 {
    with(|c| c.rank as i32)
}
extern "C" fn emu_cluster_arrive() {}
extern "C" fn emu_cluster_arrive_relaxed() {}
extern "C" fn emu_cluster_wait() {
    let cluster = with(|c| c.cluster.clone());
    cluster.barrier.wait();
}
/// `mapa.shared::cluster`: `p` (in this CTA's shared memory) moved to CTA `rank`'s copy.
extern "C" fn emu_mapa(p: usize, rank: i32) -> usize {
    with(|c| {
        let own = &c.cluster.shared[c.rank as usize];
        let i = own.iter().position(|&(start, bytes)| (start..start + bytes).contains(&p)).expect("mapa of an address outside shared memory");
        c.cluster.shared[rank as usize][i].0 + (p - own[i].0)
    })
}
/// `vote.sync.ballot.b32`: the `i1` arrives in bit 0 of a byte (the rest undefined).
extern "C" fn emu_vote_ballot(_: i32, p: u8) -> i32 {
    let (cta, tid) = with(|c| (c.cta.clone(), c.tid));
    let warp = &cta.warps[(tid / 32) as usize];
    warp.slots[(tid % 32) as usize].store(u32::from(p & 1), Ordering::SeqCst);
    warp.barrier.wait();
    let bits = warp.slots.iter().enumerate().fold(0u32, |m, (l, s)| m | (s.load(Ordering::SeqCst) << l));
    warp.barrier.wait();
    bits as i32
}
/// `llvm.maximum.f32` (`max.NaN.f32`): NaN if either is NaN, and −0 < +0 (the host JIT
/// would call the C library's `fmaximumf`, which it does not resolve).
extern "C" fn emu_maximum(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a == b {
        if a.is_sign_negative() { b } else { a }
    } else {
        a.max(b)
    }
}
/// `llvm.minimum.f32`: NaN if either is NaN, and −0 < +0.
extern "C" fn emu_minimum(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a == b {
        if a.is_sign_negative() { a } else { b }
    } else {
        a.min(b)
    }
}
extern "C" fn emu_ex2(x: f32) -> f32 {
    x.exp2()
}
extern "C" fn emu_div_approx(a: f32, b: f32) -> f32 {
    a / b
}
extern "C" fn emu_f2bf(x: f32) -> u16 {
    f32_to_bf16(x)
}
extern "C" fn emu_bf2f(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}
extern "C" fn emu_f2h(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}
extern "C" fn emu_h2f(b: u16) -> f32 {
    half::f16::from_bits(b).to_f32()
}

/// `cp.async` (16 bytes, `bytes` of them read): queued in the thread's open group and
/// performed when a `cp.async.wait_group` needs its group — so a kernel that reads a
/// stage before waiting for it reads stale data here as it may on the device.
extern "C" fn emu_cp_async(dst: *mut u8, src: *const u8, bytes: i32) {
    assert_eq!(dst as usize % 16, 0, "cp.async: destination {dst:?} not 16-byte aligned");
    assert!((0..=16).contains(&bytes), "cp.async: src-size {bytes}");
    if bytes > 0 {
        assert_eq!(src as usize % 16, 0, "cp.async: source {src:?} not 16-byte aligned");
    }
    ASYNC.with(|a| a.borrow_mut().open.push(AsyncCopy { dst: dst as usize, src: src as usize, bytes: bytes as u32 }));
}
extern "C" fn emu_cp_commit() {
    ASYNC.with(|a| {
        let mut a = a.borrow_mut();
        let group = std::mem::take(&mut a.open);
        a.committed.push_back(group);
    });
}
extern "C" fn emu_cp_wait(n: i32) {
    ASYNC.with(|a| {
        let mut a = a.borrow_mut();
        while a.committed.len() > n.max(0) as usize {
            for c in a.committed.pop_front().unwrap_or_default() {
                // SAFETY: the kernel's addresses: a shared-memory chunk and `bytes`
                // bytes of an input buffer (what the emulated kernel is tested on).
                unsafe {
                    std::ptr::copy_nonoverlapping(c.src as *const u8, c.dst as *mut u8, c.bytes as usize);
                    std::ptr::write_bytes((c.dst + c.bytes as usize) as *mut u8, 0, 16 - c.bytes as usize);
                }
            }
        }
    });
}

/// Runs a warp collective: writes this lane's `mine` words into the warp's exchange
/// buffer, waits for the warp, and returns `f(lane, buffer)`.
fn collective<T>(mine: &[u32], f: impl FnOnce(usize, &[AtomicU32]) -> T) -> T {
    let (cta, tid) = with(|c| (c.cta.clone(), c.tid));
    let warp = &cta.warps[(tid / 32) as usize];
    let lane = (tid % 32) as usize;
    let n = COLLECTIVES.with(|c| {
        let n = c.get();
        c.set(n + 1);
        n
    });
    let buf = &warp.xchg[n % 2];
    for (i, w) in mine.iter().enumerate() {
        buf[lane * XCHG + i].store(*w, Ordering::SeqCst);
    }
    warp.barrier.wait();
    f(lane, buf)
}

/// `ldmatrix.sync.aligned.m8n8.x{count}{.trans}.b16`: lane `8j + r` supplies the address
/// of row `r` of matrix `j`; lane `l` receives, of each matrix, elements (l/4, 2(l%4)) and
/// (l/4, 2(l%4)+1) — with `trans` (2(l%4), l/4) and (2(l%4)+1, l/4) — low half first.
extern "C" fn emu_ldmatrix(p: *const u8, count: i32, trans: i32) {
    let a = p as usize as u64;
    let regs = collective(&[a as u32, (a >> 32) as u32], |lane, buf| {
        let row = |i: usize| -> usize {
            let v = u64::from(buf[i * XCHG].load(Ordering::SeqCst)) | (u64::from(buf[i * XCHG + 1].load(Ordering::SeqCst)) << 32);
            assert_eq!(v % 16, 0, "ldmatrix: row address {v:#x} of lane {i} not 16-byte aligned");
            v as usize
        };
        // SAFETY: shared-memory rows the kernel addresses (16 bytes each).
        let rd16 = |at: usize| unsafe { std::ptr::read_unaligned(at as *const u16) };
        let mut regs = [0u32; 4];
        for (j, reg) in regs.iter_mut().enumerate().take(count as usize) {
            let (lo, hi) = if trans == 0 {
                let r = row(8 * j + lane / 4) + 4 * (lane % 4);
                (rd16(r), rd16(r + 2))
            } else {
                let c = 2 * (lane / 4);
                (rd16(row(8 * j + 2 * (lane % 4)) + c), rd16(row(8 * j + 2 * (lane % 4) + 1) + c))
            };
            *reg = u32::from(lo) | (u32::from(hi) << 16);
        }
        regs
    });
    FRAG.with(|f| f.set(regs));
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32` (`kind` 0: bf16, 1:
/// f16): gathers the warp's fragments (layouts as `KernelBuilder::mma_m16n8k16` documents
/// them), computes this lane's part of D = A·B + C exactly (in f64) and rounds it to f32.
#[allow(clippy::too_many_arguments)]
extern "C" fn emu_mma(kind: i32, a0: u32, a1: u32, a2: u32, a3: u32, b0: u32, b1: u32, c0: f32, c1: f32, c2: f32, c3: f32) {
    let mine = [a0, a1, a2, a3, b0, b1, c0.to_bits(), c1.to_bits(), c2.to_bits(), c3.to_bits()];
    let d = collective(&mine, |lane, buf| {
        let word = |l: usize, i: usize| buf[l * XCHG + i].load(Ordering::SeqCst);
        let elem = |w: u32, half: usize| -> f64 {
            let bits = (w >> (16 * half)) as u16;
            f64::from(if kind == 0 { emu_bf2f(bits) } else { emu_h2f(bits) })
        };
        // A(row, k): lane 4·(row mod 8) + (k mod 8)/2, register (row ≥ 8) + 2·(k ≥ 8).
        let a = |row: usize, k: usize| elem(word(4 * (row % 8) + (k % 8) / 2, usize::from(row >= 8) + 2 * usize::from(k >= 8)), k % 2);
        // B(k, col): lane 4·col + (k mod 8)/2, register 4 + (k ≥ 8).
        let b = |k: usize, col: usize| elem(word(4 * col + (k % 8) / 2, 4 + usize::from(k >= 8)), k % 2);
        let (g, t) = (lane / 4, lane % 4);
        let mut d = [0u32; 4];
        for (q, out) in d.iter_mut().enumerate() {
            let (row, col) = (g + 8 * (q / 2), 2 * t + q % 2);
            let mut sum = f64::from(f32::from_bits(word(lane, 6 + q)));
            for k in 0..16 {
                sum += a(row, k) * b(k, col);
            }
            *out = (sum as f32).to_bits();
        }
        d
    });
    FRAG.with(|f| f.set(d));
}
extern "C" fn emu_frag_i(i: i32) -> u32 {
    FRAG.with(|f| f.get()[i as usize])
}
extern "C" fn emu_frag_f(i: i32) -> f32 {
    f32::from_bits(FRAG.with(|f| f.get()[i as usize]))
}

/// f32 → bf16 bits, round to nearest even (NaN stays NaN).
fn f32_to_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7fc0;
    }
    let b = x.to_bits();
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// An `ldmatrix` or `mma` call (struct-returning intrinsics, whose results do not come
/// back through the C ABI as LLVM returns them) rewritten as a void call of the
/// emulator's function, then one getter call per register and `insertvalue`s that
/// rebuild the result under its name; f16 operands (`<2 x half>`) are passed as `i32`.
/// `None` for any other line.
fn collective_call(t: &str, indent: &str, tmp: &mut usize) -> Option<String> {
    let (lhs, rhs) = t.split_once(" = call ")?;
    let (ret, rest) = rhs.split_once(" @")?;
    let (name, args) = rest.split_once('(')?;
    let args = &args[..args.rfind(')')?];
    let mut out = String::new();
    let (count, getter, elem) = if let Some(shape) = name.strip_prefix("llvm.nvvm.ldmatrix.sync.aligned.m8n8.x") {
        let count: u32 = shape.split('.').next()?.parse().ok()?;
        let trans = u32::from(shape.contains(".trans"));
        out.push_str(&format!("{indent}call void @emu_ldmatrix({args}, i32 {count}, i32 {trans})\n"));
        (count, "emu_frag_i", "i32")
    } else if let Some(kind) = name.strip_prefix("llvm.nvvm.mma.m16n8k16.row.col.") {
        let kind = match kind {
            "bf16" => 0,
            "f32.f32" => 1,
            other => panic!("the emulator has no mma {other}"),
        };
        let mut pass = Vec::new();
        for a in args.split(", ") {
            if let Some(v) = a.strip_prefix("<2 x half> ") {
                *tmp += 1;
                out.push_str(&format!("{indent}%emu.t{tmp} = bitcast <2 x half> {v} to i32\n"));
                pass.push(format!("i32 %emu.t{tmp}"));
            } else {
                pass.push(a.to_string());
            }
        }
        out.push_str(&format!("{indent}call void @emu_mma(i32 {kind}, {})\n", pass.join(", ")));
        (4, "emu_frag_f", "float")
    } else {
        return None;
    };
    if count == 1 {
        out.push_str(&format!("{indent}{lhs} = call {elem} @{getter}(i32 0)\n"));
        return Some(out);
    }
    let mut agg = "poison".to_string();
    for i in 0..count {
        *tmp += 1;
        let v = format!("%emu.t{tmp}");
        out.push_str(&format!("{indent}{v} = call {elem} @{getter}(i32 {i})\n"));
        let dst = if i + 1 == count {
            lhs.to_string()
        } else {
            *tmp += 1;
            format!("%emu.t{tmp}")
        };
        out.push_str(&format!("{indent}{dst} = insertvalue {ret} {agg}, {elem} {v}, {i}\n"));
        agg = dst;
    }
    Some(out)
}

/// The kernel's IR rewritten for the host (see the module docs), plus `emu_entry(ptr
/// args)` that calls the kernel with parameters loaded from an array of 8-byte slots.
fn host_ir(ir: &str, entry: &str, params: &[KernelParam]) -> String {
    let renames = [
        ("llvm.nvvm.read.ptx.sreg.tid.x", "emu_tid_x"),
        ("llvm.nvvm.read.ptx.sreg.ntid.x", "emu_ntid_x"),
        ("llvm.nvvm.read.ptx.sreg.ctaid.x", "emu_ctaid_x"),
        ("llvm.nvvm.read.ptx.sreg.ctaid.y", "emu_ctaid_y"),
        ("llvm.nvvm.read.ptx.sreg.ctaid.z", "emu_ctaid_z"),
        ("llvm.nvvm.read.ptx.sreg.nctaid.x", "emu_nctaid_x"),
        ("llvm.nvvm.read.ptx.sreg.nctaid.y", "emu_nctaid_y"),
        ("llvm.nvvm.read.ptx.sreg.nctaid.z", "emu_nctaid_z"),
        ("llvm.nvvm.barrier.cta.sync.aligned.all", "emu_barrier"),
        ("llvm.nvvm.barrier.cta.sync.aligned.count", "emu_barrier_count"),
        ("llvm.nvvm.read.ptx.sreg.globaltimer", "emu_globaltimer"),
        ("llvm.nvvm.bar.warp.sync", "emu_warp_sync"),
        ("llvm.nvvm.shfl.sync.bfly.f32", "emu_shfl"),
        ("llvm.nvvm.shfl.sync.bfly.i32", "emu_shfl_i32"),
        ("llvm.maximum.f32", "emu_maximum"),
        ("llvm.minimum.f32", "emu_minimum"),
        ("llvm.nvvm.ex2.approx.f32", "emu_ex2"),
        ("llvm.nvvm.ex2.approx.ftz.f", "emu_ex2"),
        ("llvm.nvvm.div.approx.f", "emu_div_approx"),
        ("llvm.nvvm.cp.async.cg.shared.global.16.s", "emu_cp_async"),
        ("llvm.nvvm.cp.async.commit.group", "emu_cp_commit"),
        ("llvm.nvvm.cp.async.wait.group", "emu_cp_wait"),
        ("llvm.nvvm.ex2.approx.ftz.f32", "emu_ex2"),
        ("llvm.nvvm.vote.any.sync", "emu_vote_any"),
        ("llvm.nvvm.vote.ballot.sync", "emu_vote_ballot"),
        ("llvm.nvvm.read.ptx.sreg.cluster.ctarank", "emu_cluster_ctarank"),
        ("llvm.nvvm.barrier.cluster.arrive.aligned", "emu_cluster_arrive"),
        ("llvm.nvvm.barrier.cluster.arrive.relaxed.aligned", "emu_cluster_arrive_relaxed"),
        ("llvm.nvvm.barrier.cluster.wait.aligned", "emu_cluster_wait"),
        ("llvm.nvvm.mapa.shared.cluster", "emu_mapa"),
    ];
    let mut text = ir.replace("ptx_kernel ", "").replace("addrspace(1)", "").replace("addrspace(3)", "").replace("addrspace(7)", "").replace("addrspacecast", "bitcast");
    for (from, to) in renames {
        text = text.replace(&format!("@{from}("), &format!("@{to}("));
    }
    // `KernelBuilder::opaque` and `opaque_here`: an inline-asm `mov`, the identity; the
    // opaque zero of `dynamic_shared_base` (each CTA has its own module, so its own copy).
    for asm in ["asm ", "asm sideeffect "] {
        text = text.replace(&format!("{asm}\"mov.b32 $0, $1;\", \"=r,r\""), "@emu_id32").replace(&format!("{asm}\"mov.b64 $0, $1;\", \"=l,l\""), "@emu_id64");
    }
    text = text.replace("asm \"mov.u32 $0, 0;\", \"=r\"", "@emu_zero32");
    // sm_90a's `wgmma` is inline PTX with a hundred operands: the host's back end would abort
    // the process on it ("inline assembly requires more registers than available").
    if text.lines().any(|l| l.contains("asm") && l.contains("wgmma")) {
        panic!("the CPU emulator runs no wgmma kernel (emulate an sm_80 or sm_90 target)");
    }
    let mut out = String::new();
    let mut tmp = 0;
    let mut declared = std::collections::HashSet::new();
    for line in text.lines() {
        let t = line.trim_start();
        let indent = &line[..line.len() - t.len()];
        // A ptxas directive (`.pragma "nounroll"`) has nothing to run, nor has programmatic
        // dependent launch's `griddepcontrol` (CTAs run one kernel at a time) or an L2 prefetch.
        if t.starts_with("target triple") || t.starts_with("target datalayout") || t.contains("asm sideeffect \".pragma") || t.contains("asm sideeffect \"griddepcontrol.") || t.contains("asm sideeffect \"prefetch.global") {
            continue;
        }
        if t.starts_with("declare") && t.contains("@emu_") {
            // Drop the intrinsic's attributes (`memory(none)` would allow merging calls;
            // `immarg` is for intrinsics only). Two intrinsics renamed to one function
            // (`ex2.approx` with and without `.ftz`) are declared once.
            let cut = t.rfind(')').map_or(t.len(), |i| i + 1);
            let decl = t[..cut].replace(" immarg", "");
            if declared.insert(decl.clone()) {
                out.push_str(&decl);
                out.push('\n');
            }
            continue;
        }
        if t.starts_with("declare") && (t.contains("@llvm.nvvm.ldmatrix") || t.contains("@llvm.nvvm.mma.")) {
            continue;
        }
        if let Some(lines) = collective_call(t, indent, &mut tmp) {
            out.push_str(&lines);
            continue;
        }
        if let Some((lhs, rhs)) = t.split_once(" = fptrunc float ") {
            if let Some(op) = rhs.strip_suffix(" to bfloat") {
                tmp += 1;
                out.push_str(&format!("{indent}%emu.t{tmp} = call i16 @emu_f2bf(float {op})\n{indent}{lhs} = bitcast i16 %emu.t{tmp} to bfloat\n"));
                continue;
            }
        }
        if let Some(lines) = t.split_once(" = fptrunc <").and_then(|(lhs, rhs)| vector_trunc(lhs, rhs, indent, &mut tmp)) {
            out.push_str(&lines);
            continue;
        }
        if let Some((lhs, rhs)) = t.split_once(" = fpext bfloat ") {
            if let Some(op) = rhs.strip_suffix(" to float") {
                tmp += 1;
                out.push_str(&format!("{indent}%emu.t{tmp} = bitcast bfloat {op} to i16\n{indent}{lhs} = call float @emu_bf2f(i16 %emu.t{tmp})\n"));
                continue;
            }
        }
        if let Some((lhs, rhs)) = t.split_once(" = fptrunc float ") {
            if let Some(op) = rhs.strip_suffix(" to half") {
                tmp += 1;
                out.push_str(&format!("{indent}%emu.t{tmp} = call i16 @emu_f2h(float {op})\n{indent}{lhs} = bitcast i16 %emu.t{tmp} to half\n"));
                continue;
            }
        }
        if let Some((lhs, rhs)) = t.split_once(" = fpext half ") {
            if let Some(op) = rhs.strip_suffix(" to float") {
                tmp += 1;
                out.push_str(&format!("{indent}%emu.t{tmp} = bitcast half {op} to i16\n{indent}{lhs} = call float @emu_h2f(i16 %emu.t{tmp})\n"));
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out.push_str("declare i16 @emu_f2bf(float)\ndeclare float @emu_bf2f(i16)\ndeclare i16 @emu_f2h(float)\ndeclare float @emu_h2f(i16)\n");
    out.push_str("declare void @emu_ldmatrix(ptr, i32, i32)\ndeclare void @emu_mma(i32, i32, i32, i32, i32, i32, i32, float, float, float, float)\n");
    out.push_str("declare i32 @emu_frag_i(i32)\ndeclare float @emu_frag_f(i32)\n");
    out.push_str("define i32 @emu_id32(i32 %x) {\n  ret i32 %x\n}\ndefine i64 @emu_id64(i64 %x) {\n  ret i64 %x\n}\ndefine i32 @emu_zero32() {\n  ret i32 0\n}\n");
    if ir.contains("bfloat") {
        // The host's `f32 → bf16` libcall (a `bf16x2` `fma` is computed in f32 and rounded
        // by it), round to nearest even, NaN quieted: not among the JIT's symbols.
        out.push_str(
            "define bfloat @__truncsfbf2(float %f) {\n  %u = bitcast float %f to i32\n  %a = and i32 %u, 2147483647\n  %nan = icmp ugt i32 %a, 2139095040\n  %l = lshr i32 %u, 16\n  %lsb = and i32 %l, 1\n  %b = add i32 %u, 32767\n  %r = add i32 %b, %lsb\n  %rs = lshr i32 %r, 16\n  %q = or i32 %l, 64\n  %s = select i1 %nan, i32 %q, i32 %rs\n  %h = trunc i32 %s to i16\n  %v = bitcast i16 %h to bfloat\n  ret bfloat %v\n}\n",
        );
    }
    // `emu_shared_<i>()`: the address of the kernel's i-th shared-memory global.
    for (i, (name, _)) in shared_globals(ir).iter().enumerate() {
        out.push_str(&format!("define ptr @emu_shared_{i}() {{\n  ret ptr @{name}\n}}\n"));
    }
    out.push_str("define void @emu_entry(ptr %args) {\n");
    let mut call = Vec::new();
    for (i, p) in params.iter().enumerate() {
        let ty = match p {
            KernelParam::Buffer(_) => "ptr",
            KernelParam::Size(_) => "i64",
            KernelParam::TensorMap(_) => panic!("the CPU emulator runs no TMA kernel (emulate an sm_90 target)"),
        };
        out.push_str(&format!("  %p{i} = getelementptr i64, ptr %args, i64 {i}\n  %a{i} = load {ty}, ptr %p{i}\n"));
        call.push(format!("{ty} %a{i}"));
    }
    out.push_str(&format!("  call void @{entry}({})\n  ret void\n}}\n", call.join(", ")));
    out
}

/// The names of the dynamic shared-memory array: the kit's and `dynamic_shared_base`'s.
const DYNAMIC_SHARED: [&str; 2] = ["smem_dyn", "dsmem"];

/// `lhs = fptrunc <n x float> x to <n x bfloat>` (or `half`; `rhs` is what follows
/// `fptrunc <`) lane by lane through `emu_f2bf` (`emu_f2h`), as the scalar ones.
fn vector_trunc(lhs: &str, rhs: &str, indent: &str, tmp: &mut usize) -> Option<String> {
    let (n, rest) = rhs.split_once(" x float> ")?;
    let (x, to) = rest.split_once(" to <")?;
    let (ty, f) = match to.strip_prefix(&format!("{n} x "))? {
        "bfloat>" => ("bfloat", "emu_f2bf"),
        "half>" => ("half", "emu_f2h"),
        _ => return None,
    };
    let n: usize = n.parse().ok()?;
    *tmp += 1;
    let v = format!("%emu.v{tmp}");
    let mut out = String::new();
    let mut acc = "poison".to_owned();
    for i in 0..n {
        out.push_str(&format!("{indent}{v}.e{i} = extractelement <{n} x float> {x}, i32 {i}\n{indent}{v}.b{i} = call i16 @{f}(float {v}.e{i})\n"));
        out.push_str(&format!("{indent}{v}.i{i} = insertelement <{n} x i16> {acc}, i16 {v}.b{i}, i32 {i}\n"));
        acc = format!("{v}.i{i}");
    }
    out.push_str(&format!("{indent}{lhs} = bitcast <{n} x i16> {acc} to <{n} x {ty}>\n"));
    Some(out)
}

/// The kernel IR's shared-memory globals (`addrspace(3)`), with their sizes in bytes (0
/// for the dynamic `smem_dyn` or `dsmem`), in order of definition.
fn shared_globals(ir: &str) -> Vec<(String, usize)> {
    ir.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix('@')?.split_once(" = ")?;
            let ty = rest.split_once("addrspace(3) global [")?.1;
            let bytes = ty.split_once(" x i8]")?.0.trim().parse().ok()?;
            Some((name.to_string(), bytes))
        })
        .collect()
}

/// The cluster shape of the kernel (`"nvvm.cluster_dim"="x,y,z"`), `[1, 1, 1]` without one.
fn cluster_dims(ir: &str) -> [u32; 3] {
    let Some(rest) = ir.split_once("\"nvvm.cluster_dim\"=\"").map(|(_, r)| r) else { return [1, 1, 1] };
    let dims: Vec<u32> = rest.split('"').next().unwrap_or("").split(',').map(|d| d.trim().parse().expect("a cluster dim")).collect();
    [dims[0], dims[1], dims[2]]
}

/// Runs `plan` (whose `ptx` holds the kernel's IR) on the host over `bufs` (every
/// kernel buffer's bytes, inputs then outputs) with the symbols of `bindings`.
pub fn run(plan: &LaunchPlan, bindings: &Bindings, bufs: &mut [Vec<u8>]) {
    let addrs: Vec<u64> = bufs.iter_mut().map(|b| b.as_mut_ptr() as u64).collect();
    run_at(plan, bindings, &addrs);
}

/// [`run`] with the kernel's buffers given by address (`addrs[i]` for buffer parameter `i`):
/// the caller keeps them alive and large enough ([`graph`] places them between guard bytes,
/// and passes one address twice for an in-place update).
pub(crate) fn run_at(plan: &LaunchPlan, bindings: &Bindings, addrs: &[u64]) {
    LlvmTarget::initialize_native(&InitializationConfig::default()).expect("a native LLVM target");
    let ir = host_ir(&plan.ptx, &plan.entry, &plan.params);
    if let Some(dir) = std::env::var_os("SINTER_EMU_DUMP") {
        let _ = std::fs::write(std::path::Path::new(&dir).join(format!("{}_{}.ll", plan.entry, ir.len())), &ir);
    }
    let cdims = cluster_dims(&plan.ptx);
    let nrank = (cdims[0] * cdims[1] * cdims[2]) as usize;
    let globals = shared_globals(&plan.ptx);
    let ctx = Context::create();
    // One module per CTA of a cluster, so that each has its own shared memory.
    let mut engines = Vec::with_capacity(nrank);
    let mut dynamic: Vec<Vec<u8>> = Vec::with_capacity(nrank);
    let mut shared = Vec::with_capacity(nrank);
    let mut entries = Vec::with_capacity(nrank);
    for _ in 0..nrank {
        let module = ctx
            .create_module_from_ir(MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), "emu"))
            .unwrap_or_else(|e| panic!("{}: the host IR does not parse: {e}\n{ir}", plan.entry));
        let ee = module.create_jit_execution_engine(OptimizationLevel::None).expect("MCJIT");
        map_functions(&module, &ee);
        let mut dyn_bytes = vec![0u8; plan.shared_bytes as usize + 16];
        let dyn_addr = (dyn_bytes.as_mut_ptr() as usize).div_ceil(16) * 16;
        for name in DYNAMIC_SHARED {
            if let Some(g) = module.get_global(name) {
                ee.add_global_mapping(&g, dyn_addr);
            }
        }
        let ranges: Vec<(usize, usize)> = globals
            .iter()
            .enumerate()
            .map(|(i, (name, bytes))| {
                if DYNAMIC_SHARED.contains(&name.as_str()) {
                    return (dyn_addr, plan.shared_bytes as usize);
                }
                // SAFETY: `emu_shared_<i>` has this signature (built by `host_ir`).
                let f = unsafe { ee.get_function::<unsafe extern "C" fn() -> usize>(&format!("emu_shared_{i}")) }.expect("emu_shared");
                (unsafe { f.call() }, *bytes)
            })
            .collect();
        // SAFETY: `emu_entry` has this signature (built by `host_ir`).
        let entry = unsafe { ee.get_function::<unsafe extern "C" fn(*const u64)>("emu_entry") }.expect("emu_entry");
        entries.push(unsafe { entry.as_raw() });
        shared.push(ranges);
        dynamic.push(dyn_bytes);
        engines.push((module, ee));
    }
    let args: Vec<u64> = plan
        .params
        .iter()
        .map(|p| match p {
            KernelParam::Buffer(i) => addrs[*i],
            KernelParam::Size(d) => d.eval(bindings).expect("a bound size") as u64,
            KernelParam::TensorMap(_) => panic!("the CPU emulator runs no TMA kernel"),
        })
        .collect();
    let grid: Vec<u32> = plan.grid.iter().map(|g| g.eval(bindings).expect("a bound grid")).collect();
    assert!((0..3).all(|i| grid[i] % cdims[i] == 0), "{}: grid {grid:?} is not a whole number of clusters {cdims:?}", plan.entry);
    let threads = plan.block[0];
    let args_addr = args.as_ptr() as usize;
    // One OS thread per kernel thread of a cluster, reused for every cluster in turn: a
    // barrier of all its threads separates clusters (their shared memory is reused).
    let cluster = Arc::new(Cluster { barrier: Barrier::new(threads as usize * nrank), shared });
    let ctas: Vec<Arc<Cta>> = (0..nrank)
        .map(|_| {
            Arc::new(Cta {
                barrier: Barrier::new(threads as usize),
                counted: std::sync::Mutex::new(std::collections::HashMap::new()),
                warps: (0..threads.div_ceil(32))
                    .map(|_| Warp {
                        barrier: Barrier::new(32),
                        slots: std::array::from_fn(|_| AtomicU32::new(0)),
                        xchg: std::array::from_fn(|_| (0..32 * XCHG).map(|_| AtomicU32::new(0)).collect()),
                    })
                    .collect(),
            })
        })
        .collect();
    let (nx, ny, nz) = (grid[0] / cdims[0], grid[1] / cdims[1], grid[2] / cdims[2]);
    let clusters: Vec<[u32; 3]> = (0..nz).flat_map(|z| (0..ny).flat_map(move |y| (0..nx).map(move |x| [x, y, z]))).collect();
    std::thread::scope(|s| {
        for rank in 0..nrank as u32 {
            let f = entries[rank as usize];
            let local = [rank % cdims[0], (rank / cdims[0]) % cdims[1], rank / (cdims[0] * cdims[1])];
            for tid in 0..threads {
                let cta = ctas[rank as usize].clone();
                let cluster = cluster.clone();
                let nctaid = [grid[0], grid[1], grid[2]];
                let clusters = &clusters;
                std::thread::Builder::new()
                    .stack_size(8 << 20)
                    .spawn_scoped(s, move || {
                        for c in clusters {
                            let ctaid = std::array::from_fn(|i| c[i] * cdims[i] + local[i]);
                            CTX.with(|x| *x.borrow_mut() = Some(ThreadCtx { tid, ntid: threads, ctaid, nctaid, cta: cta.clone(), rank, cluster: cluster.clone() }));
                            ASYNC.with(|a| *a.borrow_mut() = AsyncState::default());
                            // SAFETY: the kernel reads the argument slots and the buffers
                            // they point to, which outlive the scope; its own bounds checks
                            // are what this tests.
                            unsafe { f(args_addr as *const u64) };
                            cluster.barrier.wait();
                        }
                        CTX.with(|x| *x.borrow_mut() = None);
                    })
                    .expect("a thread");
            }
        }
    });
    drop(engines);
    drop(dynamic);
}

/// Maps the `emu_*` functions the host IR calls to their Rust definitions.
fn map_functions(module: &inkwell::module::Module<'_>, ee: &inkwell::execution_engine::ExecutionEngine<'_>) {
    let fns: [(&str, usize); 37] = [
        ("emu_barrier_count", emu_barrier_count as *const () as usize),
        ("emu_globaltimer", emu_globaltimer as *const () as usize),
        ("emu_tid_x", emu_tid_x as *const () as usize),
        ("emu_ntid_x", emu_ntid_x as *const () as usize),
        ("emu_ctaid_x", emu_ctaid_x as *const () as usize),
        ("emu_ctaid_y", emu_ctaid_y as *const () as usize),
        ("emu_ctaid_z", emu_ctaid_z as *const () as usize),
        ("emu_nctaid_x", emu_nctaid_x as *const () as usize),
        ("emu_nctaid_y", emu_nctaid_y as *const () as usize),
        ("emu_nctaid_z", emu_nctaid_z as *const () as usize),
        ("emu_barrier", emu_barrier as *const () as usize),
        ("emu_warp_sync", emu_warp_sync as *const () as usize),
        ("emu_shfl", emu_shfl as *const () as usize),
        ("emu_shfl_i32", emu_shfl_i32 as *const () as usize),
        ("emu_maximum", emu_maximum as *const () as usize),
        ("emu_minimum", emu_minimum as *const () as usize),
        ("emu_ex2", emu_ex2 as *const () as usize),
        ("emu_div_approx", emu_div_approx as *const () as usize),
        ("emu_f2bf", emu_f2bf as *const () as usize),
        ("emu_bf2f", emu_bf2f as *const () as usize),
        ("emu_tid_x", emu_tid_x as *const () as usize),
        ("emu_f2h", emu_f2h as *const () as usize),
        ("emu_h2f", emu_h2f as *const () as usize),
        ("emu_cp_async", emu_cp_async as *const () as usize),
        ("emu_cp_commit", emu_cp_commit as *const () as usize),
        ("emu_cp_wait", emu_cp_wait as *const () as usize),
        ("emu_ldmatrix", emu_ldmatrix as *const () as usize),
        ("emu_mma", emu_mma as *const () as usize),
        ("emu_frag_i", emu_frag_i as *const () as usize),
        ("emu_frag_f", emu_frag_f as *const () as usize),
        ("emu_vote_any", emu_vote_any as *const () as usize),
        ("emu_vote_ballot", emu_vote_ballot as *const () as usize),
        ("emu_cluster_ctarank", emu_cluster_ctarank as *const () as usize),
        ("emu_cluster_arrive", emu_cluster_arrive as *const () as usize),
        ("emu_cluster_arrive_relaxed", emu_cluster_arrive_relaxed as *const () as usize),
        ("emu_cluster_wait", emu_cluster_wait as *const () as usize),
        ("emu_mapa", emu_mapa as *const () as usize),
    ];
    for (name, addr) in fns {
        if let Some(f) = module.get_function(name) {
            ee.add_global_mapping(&f, addr);
        }
    }
}

/// Bytes past each output's extent, filled with a canary and checked after the run.
const GUARD: usize = 256;

/// A tensor's bytes as a kernel buffer holds them, then `GUARD` canary bytes.
pub fn to_bytes(t: &Tensor) -> Vec<u8> {
    let mut v = t.to_blocks().unwrap_or_default();
    for &x in t.data().iter().filter(|_| !t.dtype().is_quantized()) {
        match t.dtype() {
            DType::BF16 => v.extend(sinter_ir::dtype::bf16_from_f64(x).to_bits().to_le_bytes()),
            DType::F32 => v.extend((x as f32).to_le_bytes()),
            DType::I32 => v.extend((x as i32).to_le_bytes()),
            DType::I64 => v.extend((x as i64).to_le_bytes()),
            DType::Bool => v.push(u8::from(x != 0.0)),
            DType::F16 => v.extend(sinter_ir::dtype::f16_from_f64(x).to_bits().to_le_bytes()),
            DType::F8E4M3 => v.push(sinter_ir::dtype::f8e4m3_from_f64(x)),
            DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q4K | DType::Q6K => {}
        }
    }
    v.extend(std::iter::repeat_n(0xA5, GUARD));
    v
}

/// The first `n` elements of dtype `dt` in the bytes `b`, as f64s.
pub fn from_bytes(dt: DType, b: &[u8], n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| match dt {
            DType::BF16 => f64::from(emu_bf2f(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))),
            DType::F16 => f64::from(emu_h2f(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))),
            DType::F32 => f64::from(f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])),
            DType::F8E4M3 => sinter_ir::dtype::f8e4m3_to_f64(b[i]),
            other => panic!("output dtype {other} not compared"),
        })
        .collect()
}

/// Generates kernel `k` with `gen` (as IR), runs it on `inputs` under `bindings` and
/// compares every output with the interpreter's run of the kernel's body: element-wise
/// within DESIGN.md's tolerance (bf16: rtol 1.6e-2, atol 1e-2·max|ref|; f32: rtol 1e-5,
/// atol 1e-6·max|ref| — loosened to 2e-5 for the host's exp2), NaN exactly where the
/// reference has NaN, and nothing written past any output.
pub fn check(what: &str, g: &KernelGraph, k: Kernel, gen: impl Fn(&KernelGraph, Kernel) -> Result<LaunchPlan, CodegenError>, inputs: &[Tensor], bindings: &Bindings) {
    let body = &g.kernels[k].body;
    if std::env::var_os("SINTER_EMU_O3").is_some() && body.values.values().any(|v| v.ty.dtype == DType::BF16) {
        // Optimised IR computes in bf16 where it can prove it exact (`fadd bfloat`), which
        // the host JIT cannot lower without compiler-rt's bf16 routines.
        eprintln!("{what}: skipped under SINTER_EMU_O3 (bf16)");
        return;
    }
    let mut graph = Graph::new();
    graph.add_func(body.clone());
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let want = interp::run(&graph, &body.name, &refs, bindings).unwrap_or_else(|e| panic!("{what}: reference: {e}"));
    EMIT_IR.with(|f| f.set(true));
    let plan = gen(g, k);
    EMIT_IR.with(|f| f.set(false));
    let plan = plan.unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut bufs: Vec<Vec<u8>> = inputs.iter().map(to_bytes).collect();
    // A kv_append result is its page input updated in place (as the runtime passes one
    // buffer for both): the output starts as a copy of the input.
    let mut in_place = std::collections::HashMap::new();
    for nd in body.nodes.values().filter(|nd| nd.op.kind == sinter_ir::OpKind::KvAppend) {
        for (page, r) in nd.inputs.iter().zip(&nd.results) {
            if let (Some(i), Some(j)) = (body.params.iter().position(|p| p == page), body.outputs.iter().position(|o| o == r)) {
                in_place.insert(j, i);
            }
        }
    }
    for (j, w) in want.iter().enumerate() {
        let mut b = match in_place.get(&j) {
            Some(&i) => bufs[i].clone(),
            None => vec![0xFFu8; w.data().len() * w.dtype().size_bytes()],
        };
        b.extend(std::iter::repeat_n(0xA5, GUARD));
        bufs.push(b);
    }
    run(&plan, bindings, &mut bufs);
    for (j, w) in want.iter().enumerate() {
        let b = &bufs[inputs.len() + j];
        let n = w.data().len();
        let bytes = n * w.dtype().size_bytes();
        assert!(b[bytes..].iter().all(|&x| x == 0xA5), "{what}: output {j} written past its end");
        let got = from_bytes(w.dtype(), b, n);
        let maxref = w.data().iter().filter(|x| x.is_finite()).fold(0.0f64, |m, x| m.max(x.abs()));
        let (rtol, atol) = match w.dtype() {
            DType::BF16 | DType::F16 => (1.6e-2, 1e-2 * maxref),
            _ => (2e-5, 2e-6 * maxref),
        };
        let mut worst = 0.0f64;
        for (i, (&o, &r)) in got.iter().zip(w.data()).enumerate() {
            if r.is_nan() || o.is_nan() {
                assert!(r.is_nan() && o.is_nan(), "{what}: output {j} element {i}: {o} vs reference {r}");
                continue;
            }
            if r.is_infinite() || o.is_infinite() {
                assert_eq!(o, r, "{what}: output {j} element {i}");
                continue;
            }
            let err = (o - r).abs();
            assert!(err <= atol + rtol * r.abs(), "{what}: output {j} element {i} (of {:?}): {o} vs reference {r} (max |ref| {maxref})", w.shape());
            worst = worst.max(err);
        }
        eprintln!("{what}: output {j} {:?} matches (max abs error {worst:.3e}, max |ref| {maxref:.3e})", w.shape());
    }
}

/// Deterministic values in [−1, 1) (a 64-bit LCG), rounded to `dt`.
pub fn random(dt: DType, shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let data = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect();
    Tensor::new(dt, shape, data).expect("a tensor")
}
