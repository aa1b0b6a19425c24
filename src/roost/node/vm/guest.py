"""What runs inside the micro-VM: the initramfs's init, as shell text for busybox.

It brings the machine up, reads its user data from the metadata service at
169.254.169.254 (IMDSv2 when it can get a token, as the AWS tools do), runs it under sh
with its output on the serial console, then idles like a booted host. The ACPI power
button (QMP ``system_powerdown``, sent by stop-instances) powers it off cleanly.

- **User data runs at first boot only**, as cloud-init's scripts-user does by default
  (once per instance): before running it, init writes ``roost-user-data:<instance id>``
  to the instance's state disk (``/dev/vda``, `roost.node.vm.qemu.STATE_DISK`), which
  outlives reboots and stop/start; at a later boot it finds the mark and says so on the
  console instead. Marked before, not after: a script that never ends (a service) must
  not start twice.
- **The private address**: eth0 leases 169.254.169.15 from QEMU's user-mode network
  (the link to the metadata service), and init adds the instance's own address, what
  EC2 shows as its PrivateIpAddress (metadata ``local-ipv4``), to eth0 as a /32, so
  ``ip addr`` in the guest agrees with DescribeInstances.
"""

from __future__ import annotations

MODULES = ("virtio_mmio", "virtio_pci", "virtio_net", "virtio_blk", "button", "evdev")
"""Kernel modules the guest needs: Debian builds virtio, its transports (mmio for
microvm, PCI for q35) and the power button as modules. The build adds what they depend
on and writes the load order to /lib/modules/order."""

READY = "roost-microvm: user data starting"
"""Printed on the console when the user data is about to run (boot time is measured to
it)."""

INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp /run
mount -t tmpfs tmp /tmp
exec </dev/console >/dev/console 2>&1
for m in $(cat /lib/modules/order); do
    insmod "/lib/modules/$m.ko" || echo "roost-microvm: insmod $m failed"
done
mem=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
echo "roost-microvm: kernel $(uname -r), $(nproc) vCPU, $mem MiB"

# The power button: a press (QMP system_powerdown) powers the machine off.
for dev in /sys/class/input/event*; do
    if grep -q "Power Button" "$dev/device/name" 2>/dev/null; then
        (head -c 1 "/dev/input/${dev##*/}" >/dev/null && echo "roost-microvm: power button" \
            && sync && poweroff -f) &
    fi
done

ip link set lo up
ip link set eth0 up 2>/dev/null
if udhcpc -q -f -n -t 10 -T 1 -i eth0 -s /bin/roost-dhcp >/tmp/dhcp.log 2>&1; then
    echo "roost-microvm: eth0 $(ip -o -4 addr show eth0 | awk '{print $4}')"
else
    echo "roost-microvm: no DHCP lease on eth0 ($(ls /sys/class/net | tr '\n' ' '))"
    cat /tmp/dhcp.log
fi

# The instance's id first: the service answers 404 to a caller it does not recognise
# as well as for an item it lacks, so a 404 for the user data means "none" only once
# the service has told this instance who it is.
tries=0
until iid=$(imds instance-id 2>/tmp/imds-error); do
    tries=$((tries + 1))
    if [ $tries -ge 100 ]; then
        echo "roost-microvm: the metadata service does not answer: $(cat /tmp/imds-error)"
        break
    fi
    sleep 0.1
done
# Then the user data (IMDSv2, then v1) and the instance's own address, as EC2 shows it,
# beside the link to the metadata service (both asked at once: each ask is a round trip).
imds local-ipv4 >/tmp/local-ipv4 2>/tmp/local-ipv4-error &
asking=$!
tries=0
until [ -z "$iid" ] || imds user-data >/tmp/user-data 2>/tmp/imds-error; do
    if grep -q " 404 " /tmp/imds-error; then : >/tmp/user-data; break; fi
    tries=$((tries + 1))
    if [ $tries -ge 50 ]; then
        echo "roost-microvm: no user data: $(cat /tmp/imds-error)"
        : >/tmp/user-data
        break
    fi
    sleep 0.1
done
wait $asking
addr=$(cat /tmp/local-ipv4)
if [ -n "$addr" ]; then
    ip addr add "$addr/32" dev eth0 && echo "roost-microvm: private address $addr"
elif [ -n "$iid" ]; then
    echo "roost-microvm: no private address: $(cat /tmp/local-ipv4-error)"
fi

# User data at first boot only: the state disk remembers the instance that ran it.
mark="roost-user-data:$iid"
seen=""
[ -b /dev/vda ] && seen=$(dd if=/dev/vda bs=64 count=1 2>/dev/null | tr -d '\000')
if [ -n "$iid" ] && [ "$seen" = "$mark" ]; then
    echo "roost-microvm: user data ran at first boot; not again"
    : >/tmp/user-data
elif [ -b /dev/vda ] && [ -n "$iid" ]; then
    printf '%s' "$mark" | dd of=/dev/vda conv=notrunc 2>/dev/null && sync
fi
echo "READY"
if [ -s /tmp/user-data ]; then
    chmod +x /tmp/user-data
    if head -c 2 /tmp/user-data | grep -q '#!'; then /tmp/user-data; else sh /tmp/user-data; fi
    echo "roost-microvm: user data exited with $?"
fi
while :; do sleep 3600; done
"""

IMDS = r"""#!/bin/sh
# imds PATH: the metadata service's answer for PATH (meta-data/PATH, or user-data), with
# an IMDSv2 token when the service gives one. Raw HTTP/1.0 over busybox nc: the static
# busybox's wget cannot resolve even an address without glibc's NSS.
case "$1" in user-data|dynamic/*) path="/latest/$1" ;; *) path="/latest/meta-data/$1" ;; esac
ask() {  # the request on stdin; the answer, without CRs, into /tmp/imds.$$
    # nc reads its input from a FIFO held open until nc ends: busybox nc may stop
    # reading the answer once its input ends.
    rm -f /tmp/in.$$; mkfifo /tmp/in.$$
    # Bounded: nc's own -w stops waiting only once its input has ended.
    timeout 30 nc -w 5 169.254.169.254 80 </tmp/in.$$ >/tmp/raw.$$ 2>/dev/null &
    pid=$!
    { cat; while kill -0 $pid 2>/dev/null; do usleep 20000; done; } >/tmp/in.$$
    wait $pid
    tr -d '\r' </tmp/raw.$$ >/tmp/imds.$$
    rm -f /tmp/in.$$ /tmp/raw.$$
}
# The token is kept in /tmp/imds-token for its 6 hours (each connection costs a
# forwarder process on the host), and asked for again once the service refuses it.
token=$(cat /tmp/imds-token 2>/dev/null)
if [ -z "$token" ]; then
    ttl="X-aws-ec2-metadata-token-ttl-seconds: 21600"
    printf 'PUT /latest/api/token HTTP/1.0\r\n%s\r\n\r\n' "$ttl" | ask
    if head -n 1 /tmp/imds.$$ | grep -q " 200 "; then
        token=$(sed '1,/^$/d' /tmp/imds.$$)
        printf '%s' "$token" >/tmp/imds-token.$$ && mv /tmp/imds-token.$$ /tmp/imds-token
    fi
fi
if [ -n "$token" ]; then
    printf 'GET %s HTTP/1.0\r\nX-aws-ec2-metadata-token: %s\r\n\r\n' "$path" "$token" | ask
else
    printf 'GET %s HTTP/1.0\r\n\r\n' "$path" | ask
fi
status=$(head -n 1 /tmp/imds.$$)
case "$status" in
    *" 401 "*) rm -f /tmp/imds-token /tmp/imds.$$
               [ -z "$IMDS_AGAIN" ] && IMDS_AGAIN=1 exec "$0" "$@"
               echo "imds $path: $status" >&2; exit 1 ;;
    *" 200 "*) sed '1,/^$/d' /tmp/imds.$$; rm -f /tmp/imds.$$ ;;
    *) echo "imds $path: ${status:-no answer}" >&2; rm -f /tmp/imds.$$; exit 1 ;;
esac
"""

DHCP = r"""#!/bin/sh
# udhcpc's hook: configure the leased address and the default route.
case "$1" in
    bound|renew)
        ifconfig "$interface" "$ip" netmask "${subnet:-255.255.255.0}"
        for r in $router; do route add default gw "$r" dev "$interface"; break; done
        ;;
esac
"""


def init_script() -> str:
    return INIT.replace('"READY"', f'"{READY}"')
