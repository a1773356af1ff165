//! An HTTP fake served by actix-web on a thread of its own (the fake GitHub, the fake model
//! APIs): every request, whatever its path, goes to one handler, which does its own routing
//! like the real service it stands for.

use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::{App, FromRequest, Handler, HttpServer, Responder, web};

/// A running server; dropping it stops the server and joins its thread.
#[derive(Debug)]
pub struct Served {
    base_url: String,
    handle: ServerHandle,
    thread: Option<JoinHandle<()>>,
}

impl Served {
    /// Serves `handler` on `127.0.0.1` and a free port (2 workers), in a thread named
    /// `name`, with the state `state_for` makes for that address as the app's data; returns
    /// the server and that state once the server accepts connections. A client has
    /// `request_timeout` to send a request's head. Connections stay open 300 s when idle:
    /// longer than clients' idle-connection timeouts (hyper, reqwest: 90 s), so the server
    /// never closes a pooled connection just as it is reused.
    pub fn on_loopback<T, F, Args>(
        name: &str,
        state_for: impl FnOnce(SocketAddr) -> T,
        handler: F,
        request_timeout: Duration,
    ) -> std::io::Result<(Served, T)>
    where
        T: Clone + Send + Sync + 'static,
        F: Handler<Args> + Send + Sync,
        Args: FromRequest + 'static,
        F::Output: Responder + 'static,
    {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let state = state_for(addr);
        let data = web::Data::new(state.clone());
        let (tx, rx) = mpsc::channel::<std::io::Result<ServerHandle>>();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                actix_web::rt::System::new().block_on(async move {
                    let server = HttpServer::new(move || {
                        App::new()
                            .app_data(data.clone())
                            .default_service(web::to(handler.clone()))
                    })
                    .workers(2)
                    .keep_alive(Duration::from_secs(300))
                    .client_request_timeout(request_timeout)
                    .disable_signals()
                    .shutdown_timeout(0)
                    .listen(listener);
                    match server {
                        Ok(server) => {
                            let server = server.run();
                            let _ = tx.send(Ok(server.handle()));
                            let _ = server.await;
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                });
            })?;
        match rx.recv() {
            Ok(Ok(handle)) => Ok((
                Served {
                    base_url: format!("http://{addr}"),
                    handle,
                    thread: Some(thread),
                },
                state,
            )),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(std::io::Error::other("the server thread exited")),
        }
    }
}

impl Served {
    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // Sends the stop command at once; the future only waits for its completion.
        drop(self.handle.stop(false));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
