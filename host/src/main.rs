//! The `idem` binary. See [`idem::cli`].

#[tokio::main]
async fn main() {
    std::process::exit(idem::cli::main().await);
}
