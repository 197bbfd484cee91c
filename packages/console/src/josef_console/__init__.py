"""josef-console: a web console served by every josef node, read-only by default.

Server-rendered HTML with a little JavaScript (:mod:`josef_console.html`),
data read through the node's plugin services only (:mod:`josef_console.cluster`),
throughput sampled in the background (:mod:`josef_console.sampler`). The
entry point is :mod:`josef_console.plugin`.
"""
