//! Component tests of the probe listener over real TCP on 127.0.0.1.

mod check;
mod lifecycle;
mod limits;
mod readiness;
mod routes;
mod support;
mod wireguard;
