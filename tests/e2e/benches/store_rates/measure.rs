//! What one measured run counts, merged from its loops, and the CPU the processes used meanwhile.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_e2e::fleet::percentile;

/// How the closed loops run: for how long, how many at a time per agent (or client), and how
/// long an address is held between its ADD and its DEL.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    pub seconds: Duration,
    pub per_agent: usize,
    pub hold: Duration,
}

/// What one closed loop (or all of them, merged) did before the deadline.
#[derive(Default)]
pub struct Tally {
    /// Latency of each claim (an ADD, or the backend's claim-shaped write) completed in time.
    pub latencies: Vec<Duration>,
    /// Calls that failed (ADD or DEL, claim or release).
    pub errors: u64,
    pub first_error: Option<String>,
    /// Compare-and-swap writes lost (409) by the ceiling's own loops.
    pub conflicts: u64,
    /// Requests the ceiling's own loops made.
    pub requests: u64,
}

impl Tally {
    pub fn error(&mut self, e: impl std::fmt::Display) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }

    pub fn merge(&mut self, other: Tally) {
        self.latencies.extend(other.latencies);
        self.errors += other.errors;
        self.conflicts += other.conflicts;
        self.requests += other.requests;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// What a row measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// allot's agents.
    Allot,
    /// The backend's own loops, each on an object of its own: the ceiling ratios divide by.
    Ceiling,
    /// The backend's own loops, all on one object.
    ContendedCeiling,
}

/// One row of the report.
pub struct Row {
    pub backend: &'static str,
    pub agents: usize,
    /// What ran: allot on a shared pool, a pool per agent, or the backend's own loop.
    pub run: String,
    pub kind: Kind,
    /// Claims per second completed within the run.
    pub rate: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// Compare-and-swap writes lost (409 Conflict) per claim.
    pub conflicts: f64,
    /// Claims refused because the address was taken meanwhile (lost races), per claim.
    pub lost: f64,
    /// Requests to the backend per claim, where counted.
    pub requests: Option<f64>,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Cores used meanwhile by this process (agents or clients) and by the servers.
    pub cpu: Cpu,
    /// The rate over the backend's uncontended ceiling at the same N (filled in at the end).
    pub ratio: Option<f64>,
}

impl Row {
    pub fn new(
        backend: &'static str,
        agents: usize,
        run: &str,
        kind: Kind,
        mut tally: Tally,
        elapsed: Duration,
        cpu: Cpu,
    ) -> Row {
        tally.latencies.sort();
        let claims = tally.latencies.len();
        let (p50, p99) = if claims == 0 {
            (Duration::ZERO, Duration::ZERO)
        } else {
            (
                percentile(&tally.latencies, 0.5),
                percentile(&tally.latencies, 0.99),
            )
        };
        Row {
            backend,
            agents,
            run: run.to_string(),
            kind,
            rate: claims as f64 / elapsed.as_secs_f64(),
            p50,
            p99,
            conflicts: tally.conflicts as f64 / claims.max(1) as f64,
            lost: 0.0,
            requests: (tally.requests > 0).then(|| tally.requests as f64 / claims.max(1) as f64),
            errors: tally.errors,
            first_error: tally.first_error,
            cpu,
            ratio: None,
        }
    }

    /// Prints the row as it is measured (the table comes at the end).
    pub fn print(&self) {
        println!(
            "{} N={} {}: {:.0} claims/s, p50 {:.1} ms, p99 {:.1} ms, {:.3} conflicts and {:.3} \
             lost races per claim, {} requests per claim, {} errors{}; cores: {}",
            self.backend,
            self.agents,
            self.run,
            self.rate,
            ms(self.p50),
            ms(self.p99),
            self.conflicts,
            self.lost,
            self.requests
                .map(|x| format!("{x:.2}"))
                .unwrap_or_else(|| "uncounted".into()),
            self.errors,
            self.first_error
                .as_ref()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default(),
            self.cpu
        );
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The report: one markdown table of every row, ratios to the uncontended ceiling filled in.
pub fn table(rows: &mut [Row]) -> String {
    let ceilings: Vec<(&'static str, usize, f64)> = rows
        .iter()
        .filter(|r| r.kind == Kind::Ceiling)
        .map(|r| (r.backend, r.agents, r.rate))
        .collect();
    for r in rows.iter_mut() {
        r.ratio = ceilings
            .iter()
            .find(|(b, n, _)| *b == r.backend && *n == r.agents)
            .map(|(_, _, c)| r.rate / c);
    }
    let mut out = String::from(
        "| backend | N | run | claims/s | p50 ms | p99 ms | 409s per claim | lost races per \
         claim | requests per claim | errors | ÷ ceiling | cores: this process / servers |\n\
         |---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|---|\n",
    );
    for r in rows.iter() {
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.3} | {:.3} | {} | {} | {} | {} |\n",
            r.backend,
            r.agents,
            r.run,
            r.rate,
            ms(r.p50),
            ms(r.p99),
            r.conflicts,
            r.lost,
            r.requests.map(|x| format!("{x:.2}")).unwrap_or_default(),
            r.errors,
            r.ratio.map(|x| format!("{x:.2}")).unwrap_or_default(),
            r.cpu
        ));
    }
    out
}

/// CPU seconds used by this process and by the server processes, between two readings.
#[derive(Clone, Debug, Default)]
pub struct Cpu {
    /// Cores used on average: this process, then each server process by name.
    pub this: f64,
    pub servers: Vec<(String, f64)>,
}

impl std::fmt::Display for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2}", self.this)?;
        for (name, cores) in &self.servers {
            write!(f, " / {name} {cores:.2}")?;
        }
        Ok(())
    }
}

/// The processes whose command line names `marker` (a server's directory), by name.
pub fn servers_of(marker: &Path) -> Vec<(String, u32)> {
    let marker = marker.to_string_lossy().into_owned();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&marker) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            out.push((comm.trim().to_string(), pid));
        }
    }
    out.sort();
    out
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces) start at the state, field 3.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|v| v.parse::<f64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

/// A reading of the CPU used so far by this process and `servers`.
pub struct CpuClock {
    at: Instant,
    this: f64,
    servers: Vec<(String, u32, f64)>,
}

impl CpuClock {
    pub fn start(servers: &[(String, u32)]) -> CpuClock {
        CpuClock {
            at: Instant::now(),
            this: cpu_seconds("self"),
            servers: servers
                .iter()
                .map(|(n, p)| (n.clone(), *p, cpu_seconds(&p.to_string())))
                .collect(),
        }
    }

    pub fn read(&self) -> Cpu {
        let wall = self.at.elapsed().as_secs_f64();
        Cpu {
            this: (cpu_seconds("self") - self.this) / wall,
            servers: self
                .servers
                .iter()
                .map(|(n, p, s)| (n.clone(), (cpu_seconds(&p.to_string()) - s) / wall))
                .collect(),
        }
    }
}

/// Opens `n` stores, 10 at a time (each lists the blocks when it opens; 200 lists at once
/// outlast the store's request budget on a busy API server), each tried up to three times.
pub fn open_stores<S: Send + Sync, E: std::fmt::Debug>(
    n: usize,
    open: impl Fn(usize) -> Result<S, E> + Sync,
) -> Vec<Arc<S>> {
    let open = &open;
    let mut stores = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(10) {
        std::thread::scope(|scope| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|&i| {
                    scope.spawn(move || {
                        let mut tries = 0;
                        loop {
                            tries += 1;
                            match open(i) {
                                Ok(store) => return Arc::new(store),
                                Err(e) if tries >= 3 => panic!("store {i}: {e:?}"),
                                Err(_) => std::thread::sleep(Duration::from_secs(1)),
                            }
                        }
                    })
                })
                .collect();
            stores.extend(handles.into_iter().map(|h| h.join().unwrap()));
        });
    }
    stores
}
