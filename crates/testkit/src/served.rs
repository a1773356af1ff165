//! An HTTP fake served by actix-web on a thread of its own (the fake GitHub, the fake model
//! APIs): every request, whatever its path, goes to one handler, which does its own routing
//! like the real service it stands for.

use std::net::TcpListener;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::{App, FromRequest, Handler, HttpServer, Responder, web};

/// A running server; dropping it stops the server and joins its thread.
#[derive(Debug)]
pub struct Served {
    handle: ServerHandle,
    thread: Option<JoinHandle<()>>,
}

impl Served {
    /// Serves `handler` with `data` on `listener` (2 workers), in a thread named `name`;
    /// returns once the server accepts connections. A client has `request_timeout` to send
    /// a request's head. Connections stay open 300 s when idle: longer than clients'
    /// idle-connection timeouts (hyper, reqwest: 90 s), so the server never closes a pooled
    /// connection just as it is reused.
    pub fn start<T, F, Args>(
        name: &str,
        listener: TcpListener,
        data: web::Data<T>,
        handler: F,
        request_timeout: Duration,
    ) -> std::io::Result<Served>
    where
        T: Send + Sync + 'static,
        F: Handler<Args> + Send + Sync,
        Args: FromRequest + 'static,
        F::Output: Responder + 'static,
    {
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
            Ok(Ok(handle)) => Ok(Served {
                handle,
                thread: Some(thread),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(std::io::Error::other("the server thread exited")),
        }
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
