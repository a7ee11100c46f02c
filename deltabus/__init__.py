from deltabus.errors import DeltaBusError
