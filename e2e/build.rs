//! Generates the device-plugin gRPC types the tests' tiny plugin uses.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/deviceplugin_v1beta1.proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/deviceplugin_v1beta1.proto"], &["proto"])?;
    Ok(())
}
