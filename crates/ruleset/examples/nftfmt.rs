//! Parse an nft (or iptables-restore with `--ipt`) file and print it canonically.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (ipt, path) = match args.get(1).map(String::as_str) {
        Some("--ipt") => (true, args.get(2).cloned().unwrap_or_default()),
        _ => (false, args.get(1).cloned().unwrap_or_default()),
    };
    let r = if ipt {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let sets = args.get(3).and_then(|p| std::fs::read_to_string(p).ok());
        sluice_ruleset::parse_iptables_restore_str(&path, &text, sets.as_deref())
    } else {
        sluice_ruleset::parse_nft_file(&path)
    };
    match r {
        Ok(r) => print!("{}", r.to_nft()),
        Err(d) => {
            eprint!("{d}");
            std::process::exit(1);
        }
    }
}
