"""The ``vm`` driver: every instance a QEMU micro-VM (`roost.node.vm.driver`), booting
images that ``roost images build`` makes on the host (`roost.node.vm.build`)."""
