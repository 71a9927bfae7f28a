//! `idem` with the `fault-injection` feature: used only by tests that kill the
//! host at a fault point (`IDEM_FAULT=abort-after-commit:N`).

#[tokio::main]
async fn main() {
    std::process::exit(idem::cli::main().await);
}
