// Generates, from our own .proto files: the kubelet device-plugin v1beta1 server (ours) and
// Registration client (the kubelet's); the DRA v1 plugin service and the plugin-registration
// service (servers ours, clients for tests). Needs `protoc` (scripts/setup.sh installs it).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/deviceplugin_v1beta1.proto",
        "proto/dra_v1.proto",
        "proto/pluginregistration_v1.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&protos, &["proto"])?;
    Ok(())
}
