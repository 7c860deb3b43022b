//! vnode component tests.
