//! Assembling PTX with NVIDIA's `ptxas`, and reading its resource report.
//!
//! Every PTX text sinter generates is assembled with `ptxas` in the tests: it is the check
//! that the PTX is valid for the target (LLVM emits a call to an unknown external function
//! where an intrinsic name is misspelt; only ptxas notices), and its `-v` report says how
//! many registers, how much shared memory and how much stack each kernel uses, and whether
//! anything spilled.
//!
//! No CUDA toolkit is needed: `scripts/setup` fetches ptxas 12.9 from PyPI's
//! `nvidia-cuda-nvcc-cu12` wheel into `$SINTER_CACHE/bin` (default `~/.cache/sinter/bin`).
//! [`find_ptxas`] looks, in this order, at
//! 1. the `SINTER_PTXAS` environment variable (a path to the executable),
//! 2. `$SINTER_CACHE/bin/ptxas`, where `SINTER_CACHE` is set,
//! 3. `$HOME/.cache/sinter/bin/ptxas`.
//!
//! A ptxas still running after [`ASSEMBLY_LIMIT`] is killed and reported, not waited for.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use process_control::{ChildExt, Control};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::target::Target;

/// The environment variable naming the ptxas executable.
pub const PTXAS_ENV: &str = "SINTER_PTXAS";
/// The environment variable naming sinter's cache folder (default `~/.cache/sinter`).
pub const CACHE_ENV: &str = "SINTER_CACHE";

/// What can go wrong while finding or running ptxas.
#[derive(Debug, thiserror::Error)]
pub enum PtxasError {
    /// `SINTER_PTXAS` is set but names no file.
    #[error("{PTXAS_ENV}={} names no file", path.display())]
    EnvPathMissing {
        /// The path the variable holds.
        path: PathBuf,
    },
    /// No ptxas in any of the places searched.
    #[error(
        "ptxas not found (looked at {}); run scripts/setup, or set {PTXAS_ENV}",
        display_paths(searched)
    )]
    NotFound {
        /// The candidate paths, in the order they were tried.
        searched: Vec<PathBuf>,
    },
    /// An I/O error (writing the PTX, starting ptxas, reading the cubin).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error itself.
        #[source]
        source: std::io::Error,
    },
    /// ptxas ran and rejected the PTX.
    #[error("ptxas -arch={target} failed ({status}):\n{log}")]
    Rejected {
        /// The target assembled for.
        target: Target,
        /// ptxas's exit status, as text.
        status: String,
        /// What ptxas printed (stderr, then stdout).
        log: String,
    },
    /// ptxas ran past its time limit ([`ASSEMBLY_LIMIT`]) and was killed.
    #[error("ptxas -arch={target} did not finish in {seconds} s and was killed")]
    TimedOut {
        /// The target assembled for.
        target: Target,
        /// The limit, in seconds.
        seconds: f64,
    },
    /// ptxas succeeded but its report could not be read.
    #[error("cannot read ptxas's report: {reason}\n{log}")]
    BadReport {
        /// What was wrong.
        reason: String,
        /// What ptxas printed.
        log: String,
    },
}

fn display_paths(paths: &[PathBuf]) -> String {
    let v: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    if v.is_empty() {
        "nowhere: neither SINTER_CACHE nor HOME is set".to_owned()
    } else {
        v.join(", ")
    }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> PtxasError {
    let context = context.into();
    move |source| PtxasError::Io { context, source }
}

/// Finds the ptxas executable: `SINTER_PTXAS`, else `$SINTER_CACHE/bin/ptxas`, else
/// `$HOME/.cache/sinter/bin/ptxas`.
///
/// # Errors
/// [`PtxasError::EnvPathMissing`] if `SINTER_PTXAS` names no file (the other places are not
/// tried then: a wrong explicit setting should not be papered over), and
/// [`PtxasError::NotFound`] if no candidate exists.
pub fn find_ptxas() -> Result<PathBuf, PtxasError> {
    if let Some(p) = std::env::var_os(PTXAS_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(p);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(PtxasError::EnvPathMissing { path })
        };
    }
    let mut searched = Vec::new();
    if let Some(cache) = std::env::var_os(CACHE_ENV).filter(|p| !p.is_empty()) {
        searched.push(PathBuf::from(cache).join("bin").join("ptxas"));
    }
    if let Some(home) = std::env::var_os("HOME").filter(|p| !p.is_empty()) {
        searched.push(PathBuf::from(home).join(".cache/sinter/bin/ptxas"));
    }
    match searched.iter().find(|p| p.is_file()) {
        Some(p) => Ok(p.clone()),
        None => Err(PtxasError::NotFound { searched }),
    }
}

/// For tests that need ptxas: finds it, or decides what a missing ptxas means.
///
/// Returns `Ok(Some(path))` when found. When not found, returns `Err` if the `CI`
/// environment variable is set (CI must fail loudly, never skip), and otherwise prints
/// `skipped: ptxas not found, run scripts/setup` to stderr and returns `Ok(None)`.
///
/// # Errors
/// The [`find_ptxas`] error, when running in CI or when `SINTER_PTXAS` is set wrongly.
pub fn find_ptxas_for_tests() -> Result<Option<PathBuf>, PtxasError> {
    match find_ptxas() {
        Ok(p) => Ok(Some(p)),
        Err(e @ PtxasError::EnvPathMissing { .. }) => Err(e),
        Err(e) if std::env::var_os("CI").is_some() => Err(e), // CI must not skip
        Err(_) => {
            eprintln!("skipped: ptxas not found, run scripts/setup");
            Ok(None)
        }
    }
}

/// Resources of one function, as ptxas reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionReport {
    /// The function's (mangled) name.
    pub name: String,
    /// Whether it is a kernel (`.entry`) rather than a device function (`.func`).
    pub is_entry: bool,
    /// 32-bit registers per thread (kernels only; 0 where ptxas gives none).
    pub registers: u32,
    /// Named barriers used.
    pub barriers: u32,
    /// Static shared memory, in bytes (`smem`).
    pub shared_bytes: u64,
    /// Constant bank 0, in bytes (`cmem[0]`: the kernel's parameters and more), where reported.
    pub constant_bytes: u64,
    /// The function's own stack frame, in bytes (local memory per thread).
    pub stack_frame_bytes: u64,
    /// Stack of the kernel with every function it calls, in bytes, where reported.
    pub cumulative_stack_bytes: u64,
    /// Bytes spilled to local memory by stores.
    pub spill_store_bytes: u64,
    /// Bytes reloaded from spills.
    pub spill_load_bytes: u64,
}

impl FunctionReport {
    /// Whether ptxas spilled anything in this function.
    pub fn spills(&self) -> bool {
        self.spill_store_bytes != 0 || self.spill_load_bytes != 0
    }
}

/// What `ptxas -v` said about one PTX module.
#[derive(Clone, PartialEq, Eq)]
pub struct PtxasReport {
    /// The target assembled for.
    pub target: Target,
    /// Every function reported, in ptxas's order (kernels and device functions).
    pub functions: Vec<FunctionReport>,
    /// Warnings (`ptxas warning : …` lines).
    pub warnings: Vec<String>,
    /// The assembled cubin (ELF), for `cuobjdump --dump-sass`.
    pub cubin: Vec<u8>,
    /// Everything ptxas printed.
    pub log: String,
}

impl PtxasReport {
    /// The kernels (`.entry` functions).
    pub fn kernels(&self) -> impl Iterator<Item = &FunctionReport> {
        self.functions.iter().filter(|f| f.is_entry)
    }

    /// The function with this name, if reported.
    pub fn function(&self, name: &str) -> Option<&FunctionReport> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// Whether any function spilled.
    pub fn spills(&self) -> bool {
        self.functions.iter().any(FunctionReport::spills)
    }
}

impl fmt::Debug for PtxasReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PtxasReport")
            .field("target", &self.target)
            .field("functions", &self.functions)
            .field("warnings", &self.warnings)
            .field("cubin", &format_args!("<{} bytes>", self.cubin.len()))
            .finish_non_exhaustive()
    }
}

impl fmt::Display for PtxasReport {
    /// One line per function: a stable summary for snapshots (no timings, no paths).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for func in &self.functions {
            writeln!(
                f,
                "{} {} {}: {} registers, {} barriers, {} bytes smem, {} bytes stack, \
                 {} bytes spill stores, {} bytes spill loads",
                self.target,
                if func.is_entry { "entry" } else { "func" },
                func.name,
                func.registers,
                func.barriers,
                func.shared_bytes,
                func.stack_frame_bytes,
                func.spill_store_bytes,
                func.spill_load_bytes,
            )?;
        }
        for w in &self.warnings {
            writeln!(f, "{} warning: {w}", self.target)?;
        }
        Ok(())
    }
}

/// How long one assembly may take before ptxas is killed: the largest kernels take about a
/// second, so only a hung ptxas (or a wrong `SINTER_PTXAS`) reaches it.
pub const ASSEMBLY_LIMIT: Duration = Duration::from_secs(120);

/// Assembles `ptx` for `target` with the ptxas that [`find_ptxas`] finds.
///
/// # Errors
/// See [`find_ptxas`] and [`assemble_with`].
pub fn assemble(ptx: &str, target: &Target) -> Result<PtxasReport, PtxasError> {
    assemble_with(&find_ptxas()?, ptx, target)
}

/// Runs `ptxas -arch=<target> -v` on `ptx` (written to a temporary file) and reads its
/// report.
///
/// # Errors
/// [`PtxasError::Io`] if the temporary files cannot be written or read or ptxas cannot be
/// started; [`PtxasError::TimedOut`] past [`ASSEMBLY_LIMIT`]; [`PtxasError::Rejected`] if
/// ptxas fails; [`PtxasError::BadReport`] if its output does not parse.
pub fn assemble_with(ptxas: &Path, ptx: &str, target: &Target) -> Result<PtxasReport, PtxasError> {
    assemble_within(ptxas, ptx, target, ASSEMBLY_LIMIT)
}

/// [`assemble_with`] with the time limit `limit`.
fn assemble_within(ptxas: &Path, ptx: &str, target: &Target, limit: Duration) -> Result<PtxasReport, PtxasError> {
    let dir = TempDir::new()?;
    let ptx_path = dir.path().join("kernel.ptx");
    let cubin_path = dir.path().join("kernel.cubin");
    std::fs::write(&ptx_path, ptx).map_err(io_err(format!("writing {}", ptx_path.display())))?;
    let running = format!("running {}", ptxas.display());
    let child = Command::new(ptxas)
        .arg(format!("-arch={}", target.name()))
        .arg("-v")
        .arg(&ptx_path)
        .arg("-o")
        .arg(&cubin_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err(running.clone()))?;
    // process_control drains both pipes while it waits and kills ptxas past the limit.
    let output = child.controlled_with_output().time_limit(limit).terminate_for_timeout().wait().map_err(io_err(running))?;
    let Some(output) = output else {
        return Err(PtxasError::TimedOut { target: *target, seconds: limit.as_secs_f64() });
    };
    let status = output.status.into_std_lossy();
    let mut log = String::from_utf8_lossy(&output.stderr).into_owned();
    log.push_str(&String::from_utf8_lossy(&output.stdout));
    if !status.success() {
        return Err(PtxasError::Rejected {
            target: *target,
            status: status.to_string(),
            log,
        });
    }
    let cubin =
        std::fs::read(&cubin_path).map_err(io_err(format!("reading {}", cubin_path.display())))?;
    let (functions, warnings) = parse_report(&log)?;
    Ok(PtxasReport {
        target: *target,
        functions,
        warnings,
        cubin,
        log,
    })
}

/// Reads the functions and warnings out of `ptxas -v` output.
///
/// The lines it understands (ptxas 12.x):
/// ```text
/// ptxas info    : Compiling entry function 'k' for 'sm_90a'
/// ptxas info    : Function properties for k
///     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
/// ptxas info    : Used 12 registers, used 0 barriers, 256 bytes cumulative stack size, 1024 bytes smem, 360 bytes cmem[0]
/// ptxas warning : ...
/// ```
/// A `Used …` line belongs to the function named last.
///
/// # Errors
/// [`PtxasError::BadReport`] when a number does not parse or a resource line comes before
/// any function.
pub fn parse_report(log: &str) -> Result<(Vec<FunctionReport>, Vec<String>), PtxasError> {
    let bad = |reason: String| PtxasError::BadReport {
        reason,
        log: log.to_owned(),
    };
    let mut functions: Vec<FunctionReport> = Vec::new();
    let mut warnings = Vec::new();
    let mut current: Option<usize> = None;

    for line in log.lines() {
        let text = line.trim();
        if let Some(rest) = strip_tag(text, "ptxas warning") {
            warnings.push(rest.to_owned());
        } else if let Some(rest) = strip_tag(text, "ptxas info") {
            if let Some(r) = rest.strip_prefix("Compiling entry function '") {
                let name = r.split('\'').next().unwrap_or_default();
                current = Some(select_function(&mut functions, name, true));
            } else if let Some(name) = rest.strip_prefix("Function properties for ") {
                current = Some(select_function(&mut functions, name.trim(), false));
            } else if let Some(used) = rest.strip_prefix("Used ") {
                let i =
                    current.ok_or_else(|| bad(format!("`{text}` comes before any function")))?;
                let f = &mut functions[i];
                for item in used.split(',') {
                    let item = item.trim().trim_start_matches("used ");
                    let (num, what) = item
                        .split_once(' ')
                        .ok_or_else(|| bad(format!("cannot read `{item}`")))?;
                    let n: u64 = num
                        .parse()
                        .map_err(|_| bad(format!("`{num}` in `{item}` is not a number")))?;
                    match what {
                        "registers" | "register" => {
                            f.registers = u32::try_from(n).map_err(|_| bad(item.to_owned()))?
                        }
                        "barriers" | "barrier" => {
                            f.barriers = u32::try_from(n).map_err(|_| bad(item.to_owned()))?
                        }
                        "bytes smem" => f.shared_bytes = n,
                        "bytes cmem[0]" => f.constant_bytes = n,
                        "bytes cumulative stack size" => f.cumulative_stack_bytes = n,
                        _ => {} // other banks (cmem[2]), textures, samplers: not needed yet
                    }
                }
            }
        } else if text.contains("bytes stack frame") {
            let i = current.ok_or_else(|| bad(format!("`{text}` comes before any function")))?;
            let f = &mut functions[i];
            for item in text.split(',') {
                let item = item.trim();
                let (num, what) = item
                    .split_once(' ')
                    .ok_or_else(|| bad(format!("cannot read `{item}`")))?;
                let n: u64 = num
                    .parse()
                    .map_err(|_| bad(format!("`{num}` in `{item}` is not a number")))?;
                match what {
                    "bytes stack frame" => f.stack_frame_bytes = n,
                    "bytes spill stores" => f.spill_store_bytes = n,
                    "bytes spill loads" => f.spill_load_bytes = n,
                    _ => {}
                }
            }
        }
    }
    Ok((functions, warnings))
}

/// The index of the function named `name`, added if new; `entry` marks it a kernel.
fn select_function(functions: &mut Vec<FunctionReport>, name: &str, entry: bool) -> usize {
    let i = match functions.iter().position(|f| f.name == name) {
        Some(i) => i,
        None => {
            functions.push(FunctionReport {
                name: name.to_owned(),
                ..FunctionReport::default()
            });
            functions.len() - 1
        }
    };
    functions[i].is_entry |= entry;
    i
}

/// `"ptxas info    : rest"` → `Some("rest")` for tag `"ptxas info"`.
fn strip_tag<'a>(line: &'a str, tag: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(tag)?.trim_start();
    rest.strip_prefix(':').map(str::trim)
}

/// A fresh folder under the system's temporary folder, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir, PtxasError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let mut last_err = None;
        for _ in 0..16 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("sinter-ptxas-{}-{n}-{nanos}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last_err = Some(e),
                Err(e) => return Err(io_err(format!("creating {}", path.display()))(e)),
            }
        }
        Err(io_err(format!("creating a folder in {}", base.display()))(
            last_err.unwrap_or_else(|| std::io::Error::other("no free name")),
        ))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SM90A_LOG: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k2' for 'sm_90a'
ptxas info    : Function properties for k2
    256 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 256 bytes cumulative stack size, 1024 bytes smem
ptxas info    : Compile time = 7.699 ms
ptxas info    : Function properties for helper
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas warning : Registers are spilled to local memory in function 'k2', 8 bytes spill stores, 4 bytes spill loads
";

    const SM80_LOG: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_80'
ptxas info    : Function properties for k
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 1.379 ms
";

    #[test]
    fn parses_sm90a_report() {
        let (funcs, warnings) = parse_report(SM90A_LOG).unwrap();
        assert_eq!(
            funcs,
            vec![
                FunctionReport {
                    name: "k2".into(),
                    is_entry: true,
                    registers: 12,
                    barriers: 1,
                    shared_bytes: 1024,
                    constant_bytes: 0,
                    stack_frame_bytes: 256,
                    cumulative_stack_bytes: 256,
                    spill_store_bytes: 8,
                    spill_load_bytes: 4,
                },
                FunctionReport {
                    name: "helper".into(),
                    ..FunctionReport::default()
                },
            ]
        );
        assert!(funcs[0].spills() && !funcs[1].spills());
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].starts_with("Registers are spilled"));
    }

    #[test]
    fn parses_sm80_report() {
        let (funcs, warnings) = parse_report(SM80_LOG).unwrap();
        assert_eq!(funcs.len(), 1);
        assert_eq!(funcs[0].name, "k");
        assert!(funcs[0].is_entry);
        assert_eq!(funcs[0].registers, 8);
        assert_eq!(funcs[0].constant_bytes, 360);
        assert!(!funcs[0].spills());
        assert!(warnings.is_empty());
    }

    #[test]
    fn bad_reports_are_errors() {
        let e = parse_report("ptxas info    : Used 8 registers\n").unwrap_err();
        assert!(e.to_string().contains("before any function"), "{e}");
        let e =
            parse_report("ptxas info    : Function properties for k\n    x bytes stack frame\n")
                .unwrap_err();
        assert!(e.to_string().contains("not a number"), "{e}");
    }

    #[test]
    fn not_found_message_names_setup() {
        let e = PtxasError::NotFound {
            searched: vec![PathBuf::from("/nowhere/bin/ptxas")],
        };
        let msg = e.to_string();
        assert!(
            msg.contains("/nowhere/bin/ptxas") && msg.contains("scripts/setup"),
            "{msg}"
        );
    }

    /// A ptxas that is not there, or that prints bytes that are not UTF-8, writes no cubin,
    /// fails, or reports nonsense, gives an error naming what went wrong; none panics.
    #[test]
    fn a_missing_or_misbehaving_ptxas_is_an_error() {
        let ptx = ".version 8.5\n.target sm_80\n.address_size 64\n";
        let missing = Path::new("/nonexistent/sinter/bin/ptxas");
        let err = assemble_with(missing, ptx, &Target::SM_80).unwrap_err();
        assert!(matches!(err, PtxasError::Io { .. }) && err.to_string().contains("/nonexistent/sinter/bin/ptxas"), "{err}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let dir = TempDir::new().unwrap();
            // The arguments are `-arch=… -v <ptx> -o <cubin>`: `$5` is the cubin.
            let cases = [
                ("no-cubin", "printf '\\377\\376 done\\n' >&2", "reading"),
                ("fails", "printf '\\377 nonsense\\n' >&2; exit 3", "failed (exit status: 3)"),
                ("bad-report", "printf 'ptxas info    : Used \\377 registers\\n' >&2; : > \"$5\"", "before any function"),
            ];
            for (name, script, want) in cases {
                let path = dir.path().join(name);
                std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
                // Another test's fork may briefly hold the new file open (ETXTBSY): retry.
                let mut err = assemble_with(&path, ptx, &Target::SM_80).unwrap_err();
                for _ in 0..20 {
                    match &err {
                        PtxasError::Io { source, .. } if source.raw_os_error() == Some(26) => {
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            err = assemble_with(&path, ptx, &Target::SM_80).unwrap_err();
                        }
                        _ => break,
                    }
                }
                assert!(err.to_string().contains(want), "{name}: {err}");
            }
            // A ptxas that hangs is killed at the limit.
            let path = dir.path().join("hangs");
            std::fs::write(&path, "#!/bin/sh\nexec sleep 60\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            let t0 = std::time::Instant::now();
            let mut err = assemble_within(&path, ptx, &Target::SM_80, Duration::from_millis(500)).unwrap_err();
            for _ in 0..20 {
                match &err {
                    PtxasError::Io { source, .. } if source.raw_os_error() == Some(26) => {
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        err = assemble_within(&path, ptx, &Target::SM_80, Duration::from_millis(500)).unwrap_err();
                    }
                    _ => break,
                }
            }
            assert!(matches!(err, PtxasError::TimedOut { .. }) && err.to_string().contains("did not finish in 0.5 s"), "{err}");
            assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        }
    }

    #[test]
    fn rejected_ptx_is_an_error() {
        let Some(ptxas) = find_ptxas_for_tests().unwrap_or_else(|e| panic!("{e}")) else {
            return;
        };
        let err = assemble_with(
            &ptxas,
            ".version 8.5\n.target sm_90a\nnonsense\n",
            &Target::SM_90A,
        )
        .unwrap_err();
        assert!(matches!(err, PtxasError::Rejected { .. }), "{err}");
    }
}
