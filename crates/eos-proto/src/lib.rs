//! Generated gRPC code only: messages, client and server of `eos.dedup.v1` (see
//! `proto/eos/dedup/v1/dedup.proto`), and the encoded file descriptor set for server reflection.
//! Built by `build.rs` with a vendored `protoc`, so no system protoc is needed.

pub mod dedup {
    pub mod v1 {
        #![allow(unreachable_pub, missing_debug_implementations, clippy::all)]
        tonic::include_proto!("eos.dedup.v1");

        /// The encoded `FileDescriptorSet` of the package, for `tonic-reflection`.
        pub const FILE_DESCRIPTOR_SET: &[u8] =
            tonic::include_file_descriptor_set!("eos_dedup_v1_descriptor");
    }
}

pub use prost_types;
