// Generates the kubelet PodResources v1 client (and a server, used by tests) from our own
// .proto. Needs `protoc` (Debian: protobuf-compiler; scripts/setup.sh installs it).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/podresources_v1.proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/podresources_v1.proto"], &["proto"])?;
    Ok(())
}
