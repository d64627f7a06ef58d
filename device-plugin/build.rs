// Generates the kubelet device-plugin v1beta1 server (ours) and Registration client (the
// kubelet's) from our own .proto. Needs `protoc` (scripts/setup.sh installs it).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/deviceplugin_v1beta1.proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/deviceplugin_v1beta1.proto"], &["proto"])?;
    Ok(())
}
