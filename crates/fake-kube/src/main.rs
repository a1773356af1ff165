//! `fake-kube`: the fake Kubernetes API server as a program (see the library's docs).

use std::path::PathBuf;

use clap::Parser;

/// A fake Kubernetes API server on 127.0.0.1 that runs pods under bubblewrap.
#[derive(Debug, Parser)]
#[command(name = "fake-kube")]
struct Args {
    /// Where to listen (loopback only; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    /// Where to write the kubeconfig.
    #[arg(long)]
    kubeconfig_out: PathBuf,
    /// An image and the root file system its containers run on (`host=/`).
    #[arg(long = "image", value_name = "NAME=ROOTFS")]
    images: Vec<String>,
    /// A namespace to create (the first is the kubeconfig's).
    #[arg(long = "namespace")]
    namespaces: Vec<String>,
    /// A YAML stream with a Role and its RoleBinding: every request is checked against it.
    #[arg(long)]
    role: Option<PathBuf>,
    /// Where pod logs and volumes go (default: a temporary directory).
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fake-kube: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    let mut options = agentry_fake_kube::Options {
        listen: args.listen,
        kubeconfig_out: Some(args.kubeconfig_out),
        namespaces: args.namespaces,
        state_dir: args.state_dir,
        ..Default::default()
    };
    for image in &args.images {
        let (name, root) = image
            .split_once('=')
            .ok_or_else(|| format!("--image {image:?}: expected NAME=ROOTFS"))?;
        let root = PathBuf::from(root);
        if !root.is_dir() {
            return Err(format!(
                "--image {name}: {} is not a directory",
                root.display()
            ));
        }
        options.images.insert(name.to_owned(), root);
    }
    if let Some(path) = &args.role {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        options.role = Some(agentry_fake_kube::Rbac::from_yaml(&text)?);
    }
    let fake = agentry_fake_kube::FakeKube::start(options).map_err(|e| e.to_string())?;
    println!("{}", fake.addr());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| e.to_string())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        Ok::<(), String>(())
    })?;
    drop(fake);
    Ok(())
}
