"""A fake IPMI BMC for hostcycle's tests, built on pyghmi's BMC server.

Answers `ipmitool -I lanplus` chassis power commands for one pretend host.
The current power state is written to --state-file after every change so a
test can check it without going through IPMI. Prints "listening" once bound.
"""

import argparse
import os
import sys
import uuid

import pyghmi.ipmi.bmc as bmc


class FakeBmc(bmc.Bmc):
    def __init__(self, authdata, port, address, power, state_file):
        super().__init__(authdata, port=port, address=address)
        self.state_file = state_file
        # One machine, one GUID (`ipmitool mc guid`): what hostcycle binds its readings to.
        self.guid = uuid.uuid4()
        self.set_power(power)

    def set_power(self, power):
        self.powerstate = power
        # Write-then-rename so a reader never sees a half-written file.
        tmp = self.state_file + '.tmp'
        with open(tmp, 'w') as f:
            f.write(power)
        os.replace(tmp, self.state_file)
        print('power is now %s' % power, flush=True)

    def get_power_state(self):
        return self.powerstate

    def get_system_guid(self):
        return self.guid

    def power_off(self):
        self.set_power('off')

    def power_on(self):
        self.set_power('on')

    def power_shutdown(self):
        # A real host would shut down its OS first; this one stops at once.
        self.set_power('off')

    def power_reset(self):
        self.set_power('on')

    def power_cycle(self):
        self.set_power('on')

    def is_active(self):
        return self.powerstate == 'on'


def main():
    parser = argparse.ArgumentParser(prog='fake_ipmi_bmc')
    parser.add_argument('--address', default='127.0.0.1')
    parser.add_argument('--port', type=int, required=True)
    parser.add_argument('--user', required=True)
    parser.add_argument('--power', choices=['on', 'off'], default='off')
    parser.add_argument('--state-file', required=True)
    args = parser.parse_args()
    # The password comes from the environment so it is not visible in `ps`.
    password = os.environ.get('FAKE_BMC_PASSWORD')
    if not password:
        print('FAKE_BMC_PASSWORD is not set', file=sys.stderr, flush=True)
        return 2
    server = FakeBmc({args.user: password}, args.port, args.address,
                     args.power, args.state_file)
    print('listening on %s:%d' % (args.address, args.port), flush=True)
    server.listen()
    return 0


if __name__ == '__main__':
    sys.exit(main())
