//! Generates the gRPC code with the protoc binary shipped in `protoc-bin-vendored`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../../proto");
    let proto = proto_root.join("eos/dedup/v1/dedup.proto");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .file_descriptor_set_path(out_dir.join("eos_dedup_v1_descriptor.bin"))
        .compile_with_config(
            config,
            &[proto],
            &[proto_root, protoc_bin_vendored::include_path()?],
        )?;
    println!("cargo:rerun-if-changed=../../proto");
    Ok(())
}
