//! Rebuilds the crate when anything under `templates/` changes, a new file
//! included: `include_dir!` (scaffold) tracks the files it embedded, not the
//! ones added next to them.

fn main() {
    println!("cargo::rerun-if-changed=templates");
}
