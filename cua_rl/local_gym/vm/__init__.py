"""VM desktops for the embedded gym (docs/local_gym.md, "VM desktops"): ``backend`` (the desktop the gym's
manager builds for a task whose setup names a VM image: templates, resume, screen, input, guest files),
``machine`` (one QEMU machine on a copy-on-write overlay), ``qmp`` (QEMU's machine protocol), ``agent`` (the
guest agent: files and commands inside the guest), ``keys`` (key names to QEMU key codes) and
``guest_image`` (the tiny Linux test guest)."""
