// `sqlx::migrate!` embeds migrations/ at compile time, but cargo does not watch that folder: a new
// migration alone would not rebuild the crate.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
