package runtime

// InstanceID exposes the instance id of a runtime for leak checks.
func InstanceID(rt Runtime) string {
	switch r := rt.(type) {
	case *LibcontainerRuntime:
		return r.inst.id
	}
	if r, ok := rt.(interface{ instanceID() string }); ok {
		return r.instanceID()
	}
	return ""
}

// InstanceDir exposes the instance's state directory for leak checks.
func InstanceDir(rt Runtime) string {
	switch r := rt.(type) {
	case *LibcontainerRuntime:
		return r.inst.dir
	}
	if r, ok := rt.(interface{ instanceDir() string }); ok {
		return r.instanceDir()
	}
	return ""
}
