//! `allot-fuzz-afl <target>`: runs one allot fuzz target under AFL++ (persistent mode).
//! The target names and bodies are `allot_fuzz::TARGETS`.

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let Some(target) = allot_fuzz::target(&name) else {
        let names: Vec<_> = allot_fuzz::TARGETS.iter().map(|t| t.name).collect();
        eprintln!("usage: allot-fuzz-afl <target>; targets: {}", names.join(", "));
        std::process::exit(2);
    };
    afl::fuzz!(|data: &[u8]| (target.run)(data));
}
