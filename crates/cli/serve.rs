//! `tidemark serve`: the engine's [`Service`] with the binary's signals:
//! the first SIGTERM/SIGINT stops claiming and hands the keys in flight
//! back after their current batch; SIGHUP re-reads the pipeline files (a
//! broken one is logged and its old definition kept).

use tidemark_core::Error;
use tidemark_engine::{Connections, Reloader, Service, ServiceConfig};

use crate::cli::ServeArgs;
use crate::exit::Exit;
use crate::setup::Setup;

pub async fn serve(setup: &Setup<'_>, args: ServeArgs) -> Result<Exit, Error> {
    let config = ServiceConfig {
        catalog: setup.catalog.clone(),
        workers: args.workers,
        poll: args.poll_interval,
        drain: args.drain,
        schedule: !args.no_schedule,
        public_url: args.public_url.clone(),
    };
    // The pipelines are checked before the database is opened: a
    // configuration error touches nothing.
    config
        .check(setup.clock.now())
        .map_err(|e| crate::exit::flag(e, "pipelines folder", "--pipelines"))?;
    // LISTEN on PostgreSQL, except behind PgBouncer (workers poll there).
    let listens = !setup.global.pgbouncer && !setup.global.database_url.starts_with("sqlite:");
    let work = Connections::service(&config, listens, args.listen.is_some());
    let engine = setup.engine(
        setup.connect(work).await?,
        crate::signals::on_signals(args.shutdown_timeout),
    );
    let service = match Service::new(engine.clone(), config) {
        Ok(service) => service,
        Err(e) => {
            engine.close().await;
            return Err(crate::exit::flag(e, "pipelines folder", "--pipelines"));
        }
    };
    // In the ledger's workers before the endpoints answer.
    service.announce().await;
    let options = tidemark_engine::web::WebOptions {
        log_url: args.log_url,
        metrics_max_age: args.metrics_max_age,
    };
    let web = match listen(&service, args.listen, options).await {
        Ok(web) => web,
        Err(e) => {
            engine.close().await;
            return Err(e);
        }
    };
    // Listening before anything is logged, so a SIGHUP sent once `serving`
    // shows is never missed (nor takes the default action: exit).
    let hangups = tokio::spawn(reload_on_sighup(service.reloader(), hangups()));
    let end = service.run().await;
    hangups.abort();
    if let Some(web) = web {
        // The service has stopped: so does the server (after the requests
        // in flight).
        engine.shutdown().request();
        let _ = web.await;
    }
    engine.close().await;
    Ok(if end.lease_lost {
        Exit::Held
    } else {
        Exit::Success
    })
}

/// Binds `--listen` (a refused address is a configuration error, before
/// any work) and serves the endpoints on it until the service stops.
async fn listen(
    service: &Service,
    addr: Option<std::net::SocketAddr>,
    options: tidemark_engine::web::WebOptions,
) -> Result<Option<tokio::task::JoinHandle<()>>, Error> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::config(addr.to_string(), "--listen", format!("cannot listen: {e}")))?;
    tracing::info!(listen = %addr, "serving /metrics, /healthz, /readyz and the pages");
    let view = service.view();
    Ok(Some(tokio::spawn(async move {
        if let Err(e) = tidemark_engine::web::serve(listener, view, options).await {
            tracing::error!(error = %e, "the HTTP server stopped");
        }
    })))
}

/// The stream of SIGHUPs, registered now.
#[cfg(unix)]
fn hangups() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{signal, SignalKind};
    let hangups = signal(SignalKind::hangup()).ok();
    if hangups.is_none() {
        tracing::warn!("cannot listen for SIGHUP; pipeline files are read once");
    }
    hangups
}

#[cfg(not(unix))]
fn hangups() -> Option<()> {
    None
}

/// Re-reads the pipeline files on every SIGHUP.
#[cfg(unix)]
async fn reload_on_sighup(reloader: Reloader, hangups: Option<tokio::signal::unix::Signal>) {
    let Some(mut hangup) = hangups else {
        return;
    };
    while hangup.recv().await.is_some() {
        let pipelines = reloader.reload();
        tracing::info!(pipelines, "SIGHUP: pipeline files re-read");
    }
}

#[cfg(not(unix))]
async fn reload_on_sighup(_reloader: Reloader, _hangups: Option<()>) {}
