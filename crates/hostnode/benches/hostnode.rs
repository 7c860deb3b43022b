//! hostnode benchmark (filled in below).

fn main() {}
