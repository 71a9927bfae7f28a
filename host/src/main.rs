//! The `idem` binary. See [`idem::cli`].

#[tokio::main]
async fn main() {
    idem::init_tracing();
    std::process::exit(idem::cli::main().await);
}
