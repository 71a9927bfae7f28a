//! The `idem` binary. See [`idem::cli`].

/// Worker threads at least: a SQLite guest statement runs on its handler's
/// task and holds its worker until it ends (at the latest at the message's
/// deadline; ARCHITECTURE.md, "SQLite on the handler's task"), so on a
/// one-CPU machine a second worker keeps the broker connection, the
/// keep-alives and the health endpoints going meanwhile.
const MIN_WORKERS: usize = 2;

fn main() {
    let workers = std::thread::available_parallelism()
        .map_or(MIN_WORKERS, |n| n.get())
        .max(MIN_WORKERS);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("idem: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    std::process::exit(runtime.block_on(idem::cli::main()));
}
