"""VM desktops for the embedded gym: QEMU machines on copy-on-write overlays (``machine``), driven over QMP
(``qmp``). See ``machine.py`` for what exists and what is still to do."""
