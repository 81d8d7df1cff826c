//! The `memwall` command line: parses arguments and calls the library.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "memwall",
    version,
    about = "LLM inference for phone and desktop GPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a GGUF file's metadata, tensor table and totals.
    Inspect { file: PathBuf },
    /// Validate a GGUF file: structure, tensor sizes, finite scales and float values.
    Check {
        file: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Inspect { file } => inspect(&file),
        Command::Check { file, json } => check(&file, json),
    }
}

fn inspect(file: &PathBuf) -> ExitCode {
    let g = match memwall::gguf::Gguf::open(file) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    // A closed pipe (`memwall inspect f | head`) is not an error worth a message.
    let _ = memwall::inspect::inspect(&g, &mut out).and_then(|()| out.flush());
    ExitCode::SUCCESS
}

fn check(file: &PathBuf, json: bool) -> ExitCode {
    let report = memwall::check::check_file(file);
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    } else if report.is_ok() {
        println!(
            "OK: {} tensors, {} bytes checked",
            report.n_tensors, report.bytes_checked
        );
        if !report.size_checked_only.is_empty() {
            println!(
                "note: {} tensor(s) of types without a scale table were size-checked only",
                report.size_checked_only.len()
            );
        }
    } else {
        for p in &report.problems {
            println!("{}: {p}", file.display());
        }
        println!("FAILED: {} problem(s)", report.problems.len());
    }
    if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
