//! The `sinter` command-line program.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use sinter::gpu::Lowering;
use sinter::llm::{fetch, DecoderModel, Engine, SampleOptions};
use sinter::{graph, zoo, Backend, DType, Program, Target, Tensor};

#[derive(Parser)]
#[command(name = "sinter", version, about = "A tensor compiler for transformer models: DSL -> e-graph fusion -> PTX")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum Device {
    /// The CPU reference interpreter.
    Cpu,
    /// The GPU (CUDA).
    Gpu,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum Dt {
    Bf16,
    F16,
    F32,
}

impl From<Dt> for DType {
    fn from(d: Dt) -> DType {
        match d {
            Dt::Bf16 => DType::BF16,
            Dt::F16 => DType::F16,
            Dt::F32 => DType::F32,
        }
    }
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum ModeArg {
    Prefill,
    Decode,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum LoweringArg {
    /// The e-graph passes: recognitions and fused kernels.
    Fused,
    /// One kernel per IR node.
    Unfused,
}

impl From<LoweringArg> for Lowering {
    fn from(l: LoweringArg) -> Lowering {
        match l {
            LoweringArg::Fused => Lowering::Fused,
            LoweringArg::Unfused => Lowering::Unfused,
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text with a GGUF model or Hugging Face folder (SmolLM2-135M-Instruct by
    /// default); the architecture comes from the file (llama, gpt2, qwen2, qwen3, gemma3).
    Run {
        /// The user's message (rendered with the model's chat template, unless --raw).
        #[arg(long, default_value = "What is the capital of France?")]
        prompt: String,
        /// A file with one prompt per line, decoded together as one batch.
        #[arg(long, conflicts_with = "prompt")]
        batch_file: Option<PathBuf>,
        /// Tokens to generate at most.
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
        /// Where to run; the GPU by default where one is present.
        #[arg(long)]
        device: Option<Device>,
        /// A GGUF file or Hugging Face folder of any registered architecture, or the name of
        /// a model sinter fetches into its cache when missing (smollm2-135m, gemma3-270m);
        /// default: SmolLM2-135M-Instruct.
        #[arg(long)]
        model: Option<PathBuf>,
        /// 0 = greedy.
        #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
        temperature: f64,
        /// Nucleus sampling threshold.
        #[arg(long, default_value_t = 1.0)]
        top_p: f64,
        /// Seed of the sampler.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Storage dtype of weights and activations.
        #[arg(long, value_enum, default_value_t = Dt::Bf16)]
        dtype: Dt,
        /// After generating, time each kernel of one decode step (GPU only): one line per kernel
        /// with its family and ops, the total, and the time per family. With --persistent, also
        /// each kernel's span in the last persistent step (device timer; the steps are then
        /// slower by a device round trip each).
        #[arg(long)]
        profile: bool,
        /// Use a synthetic prompt of exactly N tokens instead of the chat-rendered --prompt
        /// (its tokens repeated to length N), e.g. to measure prefill at 512 or 2048 tokens.
        #[arg(long, value_name = "N", conflicts_with = "batch_file")]
        prompt_tokens: Option<usize>,
        /// With --prompt-tokens: decode this many synthetic prompts together (each starts one
        /// token later in the repeated text); 1 to 4096.
        #[arg(long, default_value_t = 1, requires = "prompt_tokens", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4096))]
        batch: usize,
        /// Run the whole generation once untimed before the measured run (device allocations,
        /// CUDA-graph capture), so that the figures are steady-state.
        #[arg(long)]
        warmup: bool,
        /// Launch every kernel of each decode step from the host instead of replaying the step
        /// as a CUDA graph (also: SINTER_NO_CUDA_GRAPH=1).
        #[arg(long)]
        no_cuda_graph: bool,
        /// Run each decode step as one launch of the persistent decode kernel built from the
        /// step's kernels, instead of a CUDA graph of them (also: SINTER_PERSISTENT=1).
        #[arg(long, conflicts_with = "no_cuda_graph")]
        persistent: bool,
        /// How the graphs become GPU kernels.
        #[arg(long, value_enum, default_value_t = LoweringArg::Fused)]
        lowering: LoweringArg,
        /// Generate --max-tokens tokens even past EOS (for throughput measurements).
        #[arg(long)]
        ignore_eos: bool,
        /// Feed the prompt as plain text, without the chat template (base models; also what
        /// happens for a model that has no template).
        #[arg(long)]
        raw: bool,
    },
    /// Serve a model over an OpenAI-compatible HTTP API (`/v1/completions`,
    /// `/v1/chat/completions`, `/v1/models`, `/health`, `/metrics`) with continuous batching;
    /// on the CPU reference interpreter where there is no GPU. Ctrl-C stops it gracefully.
    Serve {
        /// A GGUF file or Hugging Face folder, or a fetched model's name (smollm2-135m,
        /// gemma3-270m); default: SmolLM2-135M-Instruct.
        #[arg(long)]
        model: Option<PathBuf>,
        /// The model's id in requests (default: the file's or folder's name without extension).
        #[arg(long, value_parser = clap::builder::NonEmptyStringValueParser::new())]
        served_model_name: Option<String>,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: std::net::IpAddr,
        /// Port to listen on (0: any free one).
        #[arg(long, default_value_t = 8000)]
        port: u16,
        /// Where to run; the GPU by default where one is present.
        #[arg(long)]
        device: Option<Device>,
        /// Storage dtype of weights and activations.
        #[arg(long, value_enum, default_value_t = Dt::Bf16)]
        dtype: Dt,
        /// Requests decoding together at most (at least 1).
        #[arg(long, default_value_t = 64, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        max_batch: usize,
        /// Tokens the KV cache holds over all requests (default: 65 536 on the GPU; 1 024 on
        /// the interpreter, whose every step copies the pool).
        #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        kv_tokens: Option<usize>,
        /// Requests waiting at most beyond free batch places (beyond it: 503 with Retry-After;
        /// at least 1).
        #[arg(long, default_value_t = 256, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        max_queue: usize,
        /// How the graphs become GPU kernels.
        #[arg(long, value_enum, default_value_t = LoweringArg::Fused)]
        lowering: LoweringArg,
    },
    /// Compile a model's prefill and decode kernels into the kernel cache for a target, with
    /// no GPU (a build without LLVM then runs them from the cache).
    Precompile {
        /// A GGUF file or Hugging Face folder, or a fetched model's name (smollm2-135m,
        /// gemma3-270m); default: SmolLM2 from the cache.
        #[arg(long)]
        model: Option<PathBuf>,
        /// sm_80, sm_90 or sm_90a.
        #[arg(long, default_value = "sm_90a")]
        target: Target,
        /// Storage dtype.
        #[arg(long, value_enum, default_value_t = Dt::Bf16)]
        dtype: Dt,
        /// How the graphs become GPU kernels.
        #[arg(long, value_enum, default_value_t = LoweringArg::Fused)]
        lowering: LoweringArg,
        /// Batch sizes whose decode graph is also compiled specialised (the batch a constant:
        /// the flat GEMM for the projections); other batches run the symbolic decode graph.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16])]
        decode_batches: Vec<usize>,
    },
    /// Compile a `.sir` file's kernels to PTX for a target, with no GPU: one `<entry>.ptx` per
    /// distinct kernel and `plan.json` (every kernel's launch plan, in launch order) into a folder.
    Compile {
        /// The `.sir` file (its entry function: `@main`, else the last one).
        file: PathBuf,
        /// sm_80, sm_90 or sm_90a.
        #[arg(long, default_value = "sm_90a")]
        target: Target,
        /// The folder to write into (created when missing).
        #[arg(long)]
        out: PathBuf,
        /// How the graph becomes kernels.
        #[arg(long, value_enum, default_value_t = LoweringArg::Fused)]
        lowering: LoweringArg,
    },
    /// Build a small example graph, print it, and run it on the interpreter.
    Demo,
    /// Run each kernel family on the GPU at the shapes of bench/anchors.py and print time,
    /// GB/s or TFLOP/s and the ratio to the anchors measured in the same call.
    Bench {
        /// Groups to run, separated by spaces or commas (default: all): swiglu rmsnorm softmax
        /// bias rope gather cast kv_append layernorm log_softmax reduce rows matmul fp8 qmatmul
        /// attn decode cascade (fp8 and the attention group's fp8 rows run on sm_90a only).
        #[arg(long, num_args = 1.., value_delimiter = ',')]
        only: Vec<String>,
        /// anchors.json written by bench/anchors.py in the same device call (and more such
        /// files, e.g. bench/anchors_cascade.py's: their rows are joined).
        #[arg(long, num_args = 1..)]
        anchors: Vec<PathBuf>,
        /// Timed iterations per row (median reported).
        #[arg(long, default_value_t = 20)]
        iters: usize,
        /// Write the rows as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Compile the kernels into the cache for this target (sm_80, sm_90, sm_90a) instead of
        /// running; needs no GPU. A build without LLVM then runs them from the cache.
        #[arg(long)]
        precompile: Option<Target>,
        /// Time the schedule candidates of each tunable kernel first and keep the fastest (in
        /// the kernel cache; later runs use it). With --precompile: compile every candidate.
        #[arg(long)]
        autotune: bool,
        /// Time each run on an idle GPU, the host's launch latency included. By default each timed run follows a 256 MiB fill that clears the L2, as
        /// `triton.testing.do_bench` does before each anchor run, and the launch is queued while
        /// the GPU is still busy with it. --autotune times its candidates after the fill either
        /// way.
        #[arg(long)]
        no_flush: bool,
    },
    /// Parse and verify a `.sir` file; print it back in canonical form.
    Check {
        /// The file.
        file: PathBuf,
    },
    /// Run the fusion passes on a zoo model (smollm2-135m, llama3-8b, gpt2, gpt2-124m, qwen2-0.5b, qwen3-0.6b, gemma3-270m) or a `.sir` file and
    /// print the fusion report, the kernels and the kernels per layer: prefill, decode (the batch a symbol), and decode at batches of 1 and 16 (as the engine compiles it).
    Explain {
        /// A zoo model's name or a `.sir` file.
        target: String,
        /// Storage dtype (zoo models).
        #[arg(long, value_enum, default_value_t = Dt::Bf16)]
        dtype: Dt,
        /// Write Graphviz files of each graph before and after fusion into this folder.
        #[arg(long)]
        dot: Option<PathBuf>,
        /// Also list each kernel's schedule candidates for this target (sm_80, sm_90, sm_90a): the
        /// default first, and the winner where autotuning has timed them (kernel cache). The
        /// passes then fuse for this target (default: sm_90a).
        #[arg(long)]
        schedules: Option<Target>,
        /// Shard each graph for this many tensor-parallel ranks first (Megatron's plan, made by
        /// the passes) and explain the program one rank runs; the plan's summary comes first.
        #[arg(long, value_name = "N")]
        tensor_parallel: Option<usize>,
    },
    /// Print the IR of a zoo model (smollm2-135m, llama3-8b, gpt2, gpt2-124m, qwen2-0.5b, qwen3-0.6b, gemma3-270m).
    Graph {
        /// The model's zoo name.
        model: String,
        /// Which graph.
        #[arg(long, value_enum, default_value_t = ModeArg::Prefill)]
        mode: ModeArg,
        /// Storage dtype.
        #[arg(long, value_enum, default_value_t = Dt::Bf16)]
        dtype: Dt,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Demo => demo(),
        Cmd::Explain { target, dtype, dot, schedules, tensor_parallel } => explain(&target, dtype.into(), dot.as_deref(), schedules, tensor_parallel),
        Cmd::Bench { only, anchors, iters, json, precompile, autotune, no_flush } => match precompile {
            Some(t) => sinter::bench::precompile(&only, &t, autotune).map(|s| eprintln!("{} kernels: {} compiled ({} of them over damaged cache entries), {} already cached", s.kernels, s.built, s.rebuilt, s.cached)).map_err(Into::into),
            None => bench(&only, &anchors, iters, json.as_deref(), autotune, !no_flush),
        },
        Cmd::Check { file } => check(&file),
        Cmd::Compile { file, target, out, lowering } => compile(&file, &target, &out, lowering.into()),
        Cmd::Graph { model, mode, dtype } => {
            let mode = if mode == ModeArg::Decode { zoo::Mode::Decode } else { zoo::Mode::Prefill };
            zoo::build(&model, mode, dtype.into()).map_err(Into::into).and_then(|g| out(&g.to_string()))
        }
        Cmd::Run { prompt, batch_file, max_tokens, device, model, temperature, top_p, seed, dtype, profile, prompt_tokens, batch, warmup, no_cuda_graph, persistent, lowering, ignore_eos, raw } => run(RunArgs {
            prompt,
            batch_file,
            max_tokens,
            device,
            model,
            temperature,
            top_p,
            seed,
            dtype: dtype.into(),
            profile,
            prompt_tokens,
            batch,
            warmup,
            no_cuda_graph,
            persistent,
            lowering: lowering.into(),
            ignore_eos,
            raw,
        }),
        Cmd::Serve { model, served_model_name, host, port, device, dtype, max_batch, kv_tokens, max_queue, lowering } => {
            let batch = sinter::llm::BatchOptions { max_batch, max_queue, ..Default::default() };
            serve(model, served_model_name, std::net::SocketAddr::new(host, port), device, dtype.into(), (batch, kv_tokens), lowering.into())
        }
        Cmd::Precompile { model, target, dtype, lowering, decode_batches } => precompile(model, &target, dtype.into(), lowering.into(), &decode_batches),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

type AnyResult = Result<(), Box<dyn std::error::Error>>;

/// Writes `text` to standard output; a reader that stops early (`sinter explain … | head`) is
/// not an error.
fn out(text: &str) -> AnyResult {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

fn demo() -> AnyResult {
    let g = graph! {
        fn mlp(x: f32[T, 4], w_gate: f32[4, 8], w_up: f32[4, 8], w_down: f32[8, 4]) -> f32[T, 4] {
            ((x @ w_gate).silu() * (x @ w_up)) @ w_down
        }
    }?;
    println!("{g}");
    let mut p = Program::compile(g, Backend::Interpreter)?;
    let w = |r: usize, c: usize, s: f64| Tensor::from_fn(DType::F32, &[r, c], |i| s * ((i[0] * c + i[1]) as f64 * 0.37).sin());
    p.bind("w_gate", w(4, 8, 1.0))?;
    p.bind("w_up", w(4, 8, 0.5))?;
    p.bind("w_down", w(8, 4, 0.25))?;
    let x = Tensor::from_fn(DType::F32, &[2, 4], |i| i[0] as f64 - i[1] as f64 * 0.5);
    let y = p.run(&[("x", &x)], &[])?;
    println!("mlp(x) on the interpreter, shape {:?}:", y[0].shape());
    for row in y[0].data().chunks(4) {
        println!("  {}", row.iter().map(|v| format!("{v:9.5}")).collect::<Vec<_>>().join(" "));
    }
    Ok(())
}

fn bench(only: &[String], anchor_files: &[PathBuf], iters: usize, json: Option<&std::path::Path>, autotune: bool, flush: bool) -> AnyResult {
    let mut anchors: Vec<serde_json::Value> = Vec::new();
    for p in anchor_files {
        let text = std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
        anchors.extend(v.get("rows").and_then(|r| r.as_array()).or_else(|| v.as_array()).cloned().unwrap_or_default());
    }
    let rows = sinter::bench::run(only, &anchors, iters.max(1), autotune, flush)?;
    if let Some(p) = json {
        std::fs::write(p, serde_json::to_string_pretty(&rows)?).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    Ok(())
}

fn explain(target: &str, dtype: DType, dot: Option<&std::path::Path>, schedules: Option<Target>, tensor_parallel: Option<usize>) -> AnyResult {
    use std::fmt::Write as _;
    // The Graphviz folder is checked before the passes run.
    if let Some(dir) = dot {
        if dir.exists() && !dir.is_dir() {
            return Err(format!("--dot {}: not a directory", dir.display()).into());
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("--dot: cannot create {}: {e}", dir.display()))?;
    }
    // A path (a `.sir` name, or anything that exists) is a file; anything else a zoo model.
    let graphs: Vec<(String, sinter::Graph)> = if target.ends_with(".sir") || std::path::Path::new(target).exists() {
        let text = std::fs::read_to_string(target).map_err(|e| format!("cannot read {target}: {e}"))?;
        vec![("graph".into(), sinter::ir::parse(&text).map_err(|e| format!("{target}:{e}"))?)]
    } else if target == "gpt2" {
        vec![("prefill".into(), zoo::build(target, zoo::Mode::Prefill, dtype)?)]
    } else {
        let build = |mode| zoo::build(target, mode, dtype).map_err(|e| format!("{e}; or give a `.sir` file"));
        let decode = build(zoo::Mode::Decode)?;
        // The decode step as the engine compiles it for batches of 1 and 16 (`T` a constant:
        // the small-M kernels, norms in the projections' prologues where that pays).
        let batch = |b: i64| decode.specialize(&[("T".to_string(), b)].into_iter().collect());
        let (b1, b16) = (batch(1), batch(16));
        vec![("prefill".into(), build(zoo::Mode::Prefill)?), ("decode".into(), decode), ("decode-b1".into(), b1), ("decode-b16".into(), b16)]
    };
    for (mode, g) in &graphs {
        let arch = schedules.unwrap_or(Target::SM_90A);
        let mut text = format!("=== {target} ({mode}) ===\n");
        let sharded;
        let g = match tensor_parallel {
            Some(n) => {
                let plan = sinter_passes::shard::shard(g, &sinter_passes::shard::ShardOptions::new(n)).map_err(|e| format!("--tensor-parallel {n}: {e}"))?;
                text.push_str(&plan.describe(g));
                sharded = plan.graph;
                &sharded
            }
            None => g,
        };
        let (kg, report) = sinter_passes::compile(g, &arch, &sinter_passes::PassOptions::for_graph(g))?;
        write!(text, "{report}\n")?;
        for (k, kd) in kg.kernels.iter() {
            let ops: Vec<&str> = kd.body.nodes.values().map(|n| n.op.kind.name()).collect();
            writeln!(text, "{k} {:?}: {}", kd.family, ops.join(" "))?;
            if schedules.is_some() {
                writeln!(text, "    {}", sinter::tune::describe(&kg, k, &arch))?;
            }
        }
        if let Some(layers) = report.layers() {
            writeln!(text, "kernels per layer ({mode}): {layers}")?;
        }
        out(&text)?;
        if let Some(dir) = dot {
            let name = std::path::Path::new(target).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| target.to_string());
            let before = dir.join(format!("{name}-{mode}-before.dot"));
            let after = dir.join(format!("{name}-{mode}-after.dot"));
            std::fs::write(&before, sinter_passes::report::graph_dot(g)).map_err(|e| format!("cannot write {}: {e}", before.display()))?;
            std::fs::write(&after, report.to_dot(&kg)).map_err(|e| format!("cannot write {}: {e}", after.display()))?;
            eprintln!("wrote {} and {}", before.display(), after.display());
        }
    }
    Ok(())
}

fn check(file: &PathBuf) -> AnyResult {
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let g = sinter::ir::parse(&text).map_err(|e| format!("{}:{e}", file.display()))?;
    sinter::ir::verify(&g).map_err(|e| format!("{}: {e}", file.display()))?;
    out(&g.to_string())
}

/// `sinter compile`: the file's kernels as PTX and their launch plans in `out`, then one line
/// on standard output.
fn compile(file: &std::path::Path, target: &Target, out_dir: &std::path::Path, lowering: Lowering) -> AnyResult {
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let g = sinter::ir::parse(&text).map_err(|e| format!("{}:{e}", file.display()))?;
    sinter::ir::verify(&g).map_err(|e| format!("{}: {e}", file.display()))?;
    // The folder is made before the kernels are generated, so that a bad one fails at once.
    if out_dir.exists() && !out_dir.is_dir() {
        return Err(format!("cannot write {}: it exists and is not a folder", out_dir.display()).into());
    }
    std::fs::create_dir_all(out_dir).map_err(|e| sinter::Error::Write { path: out_dir.display().to_string(), source: e })?;
    let compiled = sinter::compile_ptx_with(&g, target, lowering)?;
    let written = compiled.write_to(out_dir)?;
    let n = |count: usize, what: &str| format!("{count} {what}{}", if count == 1 { "" } else { "s" });
    out(&format!(
        "{}: {} for {target}, {} and plan.json in {}\n",
        file.display(),
        n(compiled.kernels.len(), "kernel"),
        n(written.ptx_files.len(), "PTX file"),
        out_dir.display()
    ))
}

struct RunArgs {
    prompt: String,
    batch_file: Option<PathBuf>,
    max_tokens: usize,
    device: Option<Device>,
    model: Option<PathBuf>,
    temperature: f64,
    top_p: f64,
    seed: u64,
    dtype: DType,
    profile: bool,
    prompt_tokens: Option<usize>,
    batch: usize,
    warmup: bool,
    no_cuda_graph: bool,
    persistent: bool,
    lowering: Lowering,
    ignore_eos: bool,
    raw: bool,
}

/// The GPU of `--device`, or none for the interpreter (the GPU by default where one is present).
fn open_device(device: Option<Device>, lowering: Lowering) -> Result<Option<sinter_runtime::Device>, Box<dyn std::error::Error>> {
    let gpu = match device {
        Some(Device::Cpu) => None,
        Some(Device::Gpu) => Some(sinter_runtime::Device::open()?),
        None => match sinter_runtime::Device::open() {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("no GPU ({e}): running on the CPU reference interpreter");
                None
            }
        },
    };
    match &gpu {
        Some(d) => eprintln!("device: {} ({:?} lowering)", d.info(), lowering),
        None => eprintln!("device: CPU (reference interpreter)"),
    }
    Ok(gpu)
}

/// The engine for `model` on `gpu` (compiling with a progress bar), or on the interpreter.
fn build_engine(model: sinter::llm::AnyDecoder, gpu: Option<&sinter_runtime::Device>, lowering: Lowering) -> Result<Engine<sinter::llm::AnyDecoder>, Box<dyn std::error::Error>> {
    Ok(match gpu {
        Some(d) => {
            let bar = ProgressBar::new(0);
            bar.set_style(ProgressStyle::with_template("compiling {msg} [{bar:30}] {pos}/{len} kernels").map_err(|e| e.to_string())?.progress_chars("=> "));
            bar.enable_steady_tick(std::time::Duration::from_millis(200));
            let e = Engine::new_gpu_with_progress(model, d, lowering, &mut |graph, done, total| {
                if total == 0 {
                    bar.set_message(format!("{graph} (lowering)"));
                } else {
                    bar.set_message(graph.to_string());
                }
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            });
            bar.finish_and_clear();
            e?
        }
        None => Engine::new(model)?,
    })
}

fn serve(model: Option<PathBuf>, name: Option<String>, addr: std::net::SocketAddr, device: Option<Device>, dtype: DType, (mut batch, kv_tokens): (sinter::llm::BatchOptions, Option<usize>), lowering: Lowering) -> AnyResult {
    let gpu = open_device(device, lowering)?;
    let path = model_path(model.as_ref())?;
    let m = sinter::llm::open(&path, dtype, &mut |_, _| {})?;
    let name = name.unwrap_or_else(|| path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into()));
    let context = m.context();
    let engine = build_engine(m, gpu.as_ref(), lowering)?;
    batch.kv_tokens = kv_tokens.unwrap_or(if engine.is_gpu() { 65536 } else { 1024.min(context) });
    let opts = sinter::serve::ServeOptions { batch, ..sinter::serve::ServeOptions::new(name.clone()) };
    let server = sinter::serve::Server::start(engine, addr, opts, true)?;
    eprintln!("serving `{name}` at http://{}/v1 (Ctrl-C to stop)", server.addr());
    server.wait()?;
    Ok(())
}

/// `n` tokens of `base` repeated, starting `offset` tokens in.
fn synthetic_prompt(base: &[u32], n: usize, offset: usize) -> Vec<u32> {
    if base.is_empty() {
        return Vec::new();
    }
    (0..n).map(|i| base[(i + offset) % base.len()]).collect()
}

/// The model file of `--model`: a path as given, a known model's name (fetched into the
/// cache when missing), or the default model.
fn model_path(model: Option<&PathBuf>) -> Result<PathBuf, sinter::llm::gguf::ModelError> {
    let say = &mut |m: &str| eprintln!("{m}");
    match model {
        Some(p) if !p.exists() => match p.to_str().and_then(fetch::known_model) {
            Some(known) => fetch::ensure_model(known, say),
            None => {
                let names: Vec<&str> = fetch::KNOWN_MODELS.iter().map(|m| m.name).collect();
                let why = format!("no such file or folder, and not a model name sinter fetches ({})", names.join(", "));
                Err(sinter::llm::gguf::ModelError::Io { path: p.clone(), source: std::io::Error::new(std::io::ErrorKind::NotFound, why) })
            }
        },
        Some(p) => Ok(p.clone()),
        None => fetch::ensure_default_model(say),
    }
}

fn precompile(model: Option<PathBuf>, target: &Target, dtype: DType, lowering: Lowering, decode_batches: &[usize]) -> AnyResult {
    let path = model_path(model.as_ref())?;
    let m = sinter::llm::open(&path, dtype, &mut |_, _| {})?;
    let cache = sinter_runtime::KernelCache::open_default()?;
    // The lowerings too: a build without LLVM then starts without running the passes.
    let lowerings = sinter_runtime::KernelCache::new(sinter::gpu::lowering_cache::default_dir()?)?;
    // With the model's weights named, as the engine lowers them.
    let weights = m.weights().keys().cloned().collect();
    let lower = |g: &sinter::Graph| sinter::gpu::lower_with_weights(g, lowering, target, Some(&lowerings), Some(&weights)).map(|r| r.0);
    let t0 = Instant::now();
    for mode in [zoo::Mode::Prefill, zoo::Mode::Decode] {
        let g = m.graph(mode)?;
        let kg = lower(&g)?;
        let mut stats = sinter::gpu::CompileStats::default();
        sinter::gpu::plans(&kg, target, &cache, &mut stats)?;
        eprintln!("{mode:?}: {} kernels ({} compiled in {:.2} s on {} threads, {} cached) for {target}", stats.kernels, stats.built, stats.build_seconds, stats.jobs, stats.cached);
    }
    for &b in decode_batches {
        let g = m.decode_graph_for_batch(b)?;
        let kg = lower(&g)?;
        let mut stats = sinter::gpu::CompileStats::default();
        sinter::gpu::plans(&kg, target, &cache, &mut stats)?;
        eprintln!("Decode at batch {b}: {} kernels ({} compiled in {:.2} s on {} threads, {} cached) for {target}", stats.kernels, stats.built, stats.build_seconds, stats.jobs, stats.cached);
    }
    eprintln!("into {} in {:.1} s", cache.dir().display(), t0.elapsed().as_secs_f64());
    Ok(())
}

/// The last persistent decode step's kernels: when each began (its first task's claim) and
/// ended (its last task's completion), µs after the step's first claim, and how long after
/// the kernel before it each ended.
fn print_persistent_spans(spans: &[(String, Option<(f64, f64)>)]) {
    println!("profile of the last decode step as one persistent launch (device timer, µs after the first claim):");
    let mut prev_end = 0f64;
    for (name, s) in spans {
        match s {
            Some((a, b)) => {
                println!("{name:<44} {a:>10.2} {b:>10.2}  span {:>8.2}  after the previous kernel {:>8.2}", b - a, b - prev_end);
                prev_end = *b;
            }
            None => println!("{name:<44} (not run)"),
        }
    }
    println!("step: {prev_end:.2} us, {} kernels, {:.2} us a kernel", spans.len(), prev_end / spans.len().max(1) as f64);
}

/// The phases of compiling the prefill and decode programs, on one line (`sinter run`), then
/// one line per cache entry that was refused (damaged, or another card's or driver's).
fn print_compile_line(ps: &sinter::gpu::CompileStats, ds: &sinter::gpu::CompileStats) {
    let both = [ps, ds];
    let sum = |f: fn(&sinter::gpu::CompileStats) -> f64| both.iter().map(|s| f(s)).sum::<f64>();
    let count = |f: fn(&sinter::gpu::CompileStats) -> usize| both.iter().map(|s| f(s)).sum::<usize>();
    let lowering = match both.iter().filter(|s| s.lowering_cached).count() {
        2 => " (cached)",
        1 => " (one cached)",
        _ => "",
    };
    let rebuilt = match count(|s| s.rebuilt) {
        0 => String::new(),
        n => format!(", {n} over damaged cache entries"),
    };
    let alongside = match count(|s| s.assembled_in_codegen) {
        0 => String::new(),
        n => format!("; {n} cubins assembled alongside, {:.3} s of thread time", sum(|s| s.assembly_in_codegen_seconds)),
    };
    let jit = match count(|s| s.ptx_jit) {
        0 => String::new(),
        n => format!(", {n} JIT-compiled from PTX"),
    };
    eprintln!(
        "compile: {:.3} s = lowering {:.3} s{lowering} + code generation {:.3} s ({} kernels on {} threads{rebuilt}{alongside}) + assembly {:.3} s ({} more cubins) + cache reads {:.3} s ({} plans, {} cubins) + module loading {:.3} s ({} modules{jit})",
        sum(|s| s.seconds),
        sum(|s| s.lower_seconds),
        sum(|s| s.build_seconds),
        count(|s| s.built),
        both.iter().map(|s| s.jobs).max().unwrap_or(1),
        sum(|s| s.assembly_seconds),
        count(|s| s.assembled),
        sum(|s| s.cache_seconds),
        count(|s| s.cached),
        count(|s| s.cubins_cached),
        sum(|s| s.load_seconds),
        count(|s| s.modules),
    );
    for d in both.iter().flat_map(|s| &s.cubins_damaged) {
        eprintln!("  kernel cache: refused and rebuilt: {d}");
    }
    let failed: Vec<&String> = both.iter().flat_map(|s| &s.assembly_failed).collect();
    if let Some(first) = failed.first() {
        eprintln!("  ptxas failed on {} kernel(s), JIT-compiled instead (point SINTER_PTXAS at a ptxas that reads this PTX version, or set SINTER_CUBIN=0); first: {first}", failed.len());
    }
}

fn run(a: RunArgs) -> AnyResult {
    if !(a.temperature.is_finite() && a.temperature >= 0.0) {
        return Err(format!("--temperature must be a finite number ≥ 0 (0 = greedy), got {}", a.temperature).into());
    }
    if !(a.top_p > 0.0 && a.top_p <= 1.0) {
        return Err(format!("--top-p must be in (0, 1], got {}", a.top_p).into());
    }
    let gpu = open_device(a.device, a.lowering)?;
    let path = model_path(a.model.as_ref())?;
    let t_load = Instant::now();
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} tensors").map_err(|e| e.to_string())?.progress_chars("=> "));
    bar.set_message(path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    let model = sinter::llm::open(&path, a.dtype, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    let raw = a.raw || model.chat_template().is_none_or(|c| c.source.is_none());
    let encode = |text: &str| if raw { model.tokenizer().encode(text) } else { model.chat_prompt(text) };
    bar.finish_and_clear();
    let load_time = t_load.elapsed();
    let prompts: Vec<String> = match &a.batch_file {
        Some(f) => std::fs::read_to_string(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect(),
        None => vec![a.prompt.clone()],
    };
    if prompts.is_empty() {
        return Err("the batch file has no prompts".into());
    }
    let ids = match a.prompt_tokens {
        Some(0) => return Err("--prompt-tokens must be at least 1".into()),
        Some(n) => {
            if a.batch == 0 {
                return Err("--batch must be at least 1".into());
            }
            let base = encode(&a.prompt)?;
            (0..a.batch).map(|s| synthetic_prompt(&base, n, s)).collect::<Vec<_>>()
        }
        None => prompts.iter().map(|p| encode(p)).collect::<Result<Vec<_>, _>>()?,
    };
    if ids.iter().any(Vec::is_empty) {
        return Err("a prompt has no tokens".into());
    }
    let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
    let context = model.context();
    if longest.checked_add(a.max_tokens).is_none_or(|n| n > context) {
        return Err(sinter::llm::gguf::ModelError::ContextOverflow { tokens: longest, max_new: a.max_tokens, context }.into());
    }
    let t_compile = Instant::now();
    let mut engine = build_engine(model, gpu.as_ref(), a.lowering)?;
    if a.no_cuda_graph {
        engine.set_cuda_graph(false);
    }
    if a.persistent {
        engine.set_persistent(true);
        // Each step then records its kernels' spans (a device round trip a step).
        engine.set_persistent_profile(a.profile);
    }
    let compile_time = t_compile.elapsed();
    eprintln!("loaded {} in {:.2} s; graphs built and compiled in {:.2} s", path.display(), load_time.as_secs_f64(), compile_time.as_secs_f64());
    let opts = SampleOptions { max_new: a.max_tokens, temperature: a.temperature, top_p: a.top_p, seed: a.seed, stop_at_eos: !a.ignore_eos };
    if a.warmup {
        let w = engine.generate(&ids, &opts, &mut |_, _| {})?;
        eprintln!("warm-up: {} decode steps untimed", w.decode_steps);
    }
    let single = ids.len() == 1;
    let mut streamed: Vec<u32> = Vec::new();
    let mut printed = 0usize;
    let tok = engine.model().tokenizer();
    let eos = engine.model().eos_tokens();
    let mut stdout = std::io::stdout();
    let out = engine.generate(&ids, &opts, &mut |_, t| {
        if !single || eos.contains(&t) {
            return;
        }
        streamed.push(t);
        if let Ok(text) = tok.decode(&streamed) {
            // Print only whole characters: a token can end inside a UTF-8 sequence.
            if !text.ends_with('\u{FFFD}') && text.len() > printed {
                let _ = write!(stdout, "{}", &text[printed..]);
                let _ = stdout.flush();
                printed = text.len();
            }
        }
    })?;
    if single {
        println!();
    } else if a.prompt_tokens.is_some() {
        for (s, t) in out.tokens.iter().enumerate() {
            let text = tok.decode(&t.iter().copied().filter(|x| !eos.contains(x)).collect::<Vec<_>>())?;
            println!("[{s}] {text}");
        }
    } else {
        for (p, t) in prompts.iter().zip(&out.tokens) {
            let text = tok.decode(&t.iter().copied().filter(|x| !eos.contains(x)).collect::<Vec<_>>())?;
            println!("> {p}\n{text}\n");
        }
    }
    let new_tokens: usize = out.tokens.iter().map(Vec::len).sum();
    let decoded = new_tokens.saturating_sub(ids.len());
    let how = if out.decode_steps == 0 {
        "no decode step".to_string()
    } else if out.persistent {
        if out.capture_time.is_zero() {
            "persistent kernel replayed".to_string()
        } else {
            format!("persistent kernel, built and captured in {:.1} ms, not counted", out.capture_time.as_secs_f64() * 1e3)
        }
    } else if out.cuda_graph {
        if out.capture_time.is_zero() {
            "CUDA graph replayed".to_string()
        } else {
            format!("CUDA graph, captured in {:.1} ms, not counted", out.capture_time.as_secs_f64() * 1e3)
        }
    } else if engine.is_gpu() {
        "eager launches".to_string()
    } else {
        "interpreter".to_string()
    };
    eprintln!(
        "prompt: {} tokens in {:.3} s ({:.1} tok/s); decode: {} steps at batch {}, {decoded} tokens in {:.3} s ({:.2} tok/s; {how})",
        out.prompt_tokens,
        out.prefill_time.as_secs_f64(),
        out.prompt_tokens as f64 / out.prefill_time.as_secs_f64().max(1e-9),
        out.decode_steps,
        ids.len(),
        out.decode_time.as_secs_f64(),
        decoded as f64 / out.decode_time.as_secs_f64().max(1e-9),
    );
    match engine.gpu_stats() {
        Some((pk, dk, ps, ds)) => {
            let layers = engine.model().kv().layers.max(1);
            let per_layer = |n: usize, s: &sinter::gpu::CompileStats| match s.kernels_per_layer {
                Some(k) => k.to_string(),
                None => format!("~{:.1}", n as f64 / layers as f64),
            };
            let at_batch = match engine.decode_kernels_at(ids.len()) {
                Some((n, k)) => format!("; decode specialised to batch {}: {} ({n} kernels a step)", ids.len(), k.map_or_else(|| format!("~{:.1}", n as f64 / layers as f64), |k| k.to_string())),
                None => String::new(),
            };
            eprintln!("kernels per layer: prefill {}, decode {} ({pk} prefill and {dk} decode kernels in all){at_batch}", per_layer(pk, &ps), per_layer(dk, &ds));
            print_compile_line(&ps, &ds);
        }
        None => eprintln!("kernels: none (the CPU reference interpreter runs the graphs); graphs built in {:.3} s", compile_time.as_secs_f64()),
    }
    if a.profile && out.persistent {
        match engine.persistent_step_profile(ids.len()) {
            Ok(Some(spans)) => print_persistent_spans(&spans),
            Ok(None) => eprintln!("--profile: the persistent step recorded nothing"),
            Err(e) => eprintln!("--profile: not available: {e}"),
        }
    }
    if a.profile {
        match engine.profile_decode(ids.len()) {
            Ok(report) => {
                println!("profile of one decode step at batch {} (eager launches timed with CUDA events):", ids.len());
                print!("{report}");
            }
            Err(e) => eprintln!("--profile: not available: {e}"),
        }
    }
    Ok(())
}
