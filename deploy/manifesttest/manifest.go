// Package manifesttest checks the Kubernetes manifest in deploy/.
//
// Decode reads every YAML document of a manifest strictly into the
// Kubernetes API types, the way the API server's strict field validation
// does: an unknown or duplicate field is an error, not a silently dropped
// setting. Check then holds the manifest to what SECURITY.md asks of a
// deployment: images pinned, the gateway probed and given resources, nothing
// but the gateway's API listener behind an externally reachable Service, and
// the gateway's Caddyfile forwarding only the inference API to the engines.
//
// It is a module of its own so that k8s.io/api and its dependencies stay out
// of caddy-llmgw's module graph. ./xcaddy.sh test runs it.
package manifesttest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// CaddyfileKey is the ConfigMap key that holds a gateway's Caddyfile.
const CaddyfileKey = "Caddyfile"

// decoder decodes the kinds a deployment of the gateway plausibly uses; any
// other kind fails to decode, so a new kind in the manifest is registered
// here (and thereby checked) rather than skipped.
var decoder = func() runtime.Decoder {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme,
		networkingv1.AddToScheme, autoscalingv2.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	// Strict: unknown fields and duplicate keys are errors. The universal
	// deserializer neither defaults nor converts, so the objects are what
	// the file says.
	return serializer.NewCodecFactory(s, serializer.EnableStrict).UniversalDeserializer()
}()

// Decode decodes every document of a multi-document YAML manifest into its
// typed Kubernetes object. Documents holding only comments are skipped.
func Decode(manifest []byte) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	var objs []runtime.Object
	for n := 1; ; n++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if onlyComments(doc) {
			continue
		}
		obj, gvk, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			if gvk != nil && gvk.Kind != "" {
				return nil, fmt.Errorf("document %d (%s): %w", n, gvk.Kind, err)
			}
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		objs = append(objs, obj)
	}
}

func onlyComments(doc []byte) bool {
	for line := range strings.SplitSeq(string(doc), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") && line != "---" {
			return false
		}
	}
	return true
}

// workload is anything that runs a pod template.
type workload struct {
	kind, name string
	labels     map[string]string
	spec       *corev1.PodSpec
	gateways   []gateway // its containers that run a Caddyfile from a ConfigMap
}

// gateway is a container running caddy-llmgw with a Caddyfile of the
// manifest.
type gateway struct {
	container *corev1.Container
	configMap string
	caddyfile *Caddyfile
}

func (w *workload) String() string { return w.kind + " " + w.name }

// Check returns every way in which the decoded manifest falls short:
//
//   - every container image names a tag other than latest, or a digest;
//   - every gateway container (one that mounts a ConfigMap holding a
//     Caddyfile) has readiness and liveness probes on a port its Caddyfile
//     listens on, CPU and memory requests and a memory limit, and there is
//     at least one;
//   - every Caddyfile passes CheckRoutes, and keeps the admin API on
//     loopback;
//   - a Service reachable from outside the cluster (LoadBalancer, NodePort,
//     external IPs) selects only gateway pods and forwards only to a port on
//     which their Caddyfile proxies to engines: never to the admin API, the
//     metrics listener, or an engine itself.
func Check(objs []runtime.Object) []error {
	var problems []error
	problemf := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }

	caddyfiles := map[string]*Caddyfile{}
	for _, obj := range objs {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			continue
		}
		src, ok := cm.Data[CaddyfileKey]
		if !ok {
			continue
		}
		cf, err := ParseCaddyfile(src)
		if err != nil {
			problemf("ConfigMap %s: Caddyfile: %v", cm.Name, err)
			continue
		}
		caddyfiles[cm.Name] = cf
		if _, err := cf.AdminListener(); err != nil {
			problemf("ConfigMap %s: Caddyfile %v", cm.Name, err)
		}
		for _, r := range cf.CheckRoutes() {
			for _, err := range r.Problems {
				problemf("ConfigMap %s: Caddyfile site %s: %v", cm.Name, strings.Join(r.Site.Addresses, " "), err)
			}
		}
	}

	var workloads []*workload
	for _, obj := range objs {
		if w := workloadOf(obj); w != nil {
			w.gateways = gatewaysOf(w.spec, caddyfiles)
			workloads = append(workloads, w)
		}
	}
	gateways := 0
	for _, w := range workloads {
		for _, c := range slices.Concat(w.spec.InitContainers, w.spec.Containers) {
			if err := imagePinned(c.Image); err != nil {
				problemf("%s container %s: %v", w, c.Name, err)
			}
		}
		for _, g := range w.gateways {
			gateways++
			for _, err := range checkGateway(g) {
				problemf("%s container %s: %v", w, g.container.Name, err)
			}
		}
	}
	if gateways == 0 {
		problemf("no gateway: no container mounts a ConfigMap with a %s", CaddyfileKey)
	}

	for _, obj := range objs {
		if svc, ok := obj.(*corev1.Service); ok {
			for _, err := range checkService(svc, workloads) {
				problemf("Service %s: %v", svc.Name, err)
			}
		}
	}
	return problems
}

func workloadOf(obj runtime.Object) *workload {
	switch o := obj.(type) {
	case *appsv1.Deployment:
		return &workload{kind: "Deployment", name: o.Name, labels: o.Spec.Template.Labels, spec: &o.Spec.Template.Spec}
	case *appsv1.StatefulSet:
		return &workload{kind: "StatefulSet", name: o.Name, labels: o.Spec.Template.Labels, spec: &o.Spec.Template.Spec}
	case *appsv1.DaemonSet:
		return &workload{kind: "DaemonSet", name: o.Name, labels: o.Spec.Template.Labels, spec: &o.Spec.Template.Spec}
	case *appsv1.ReplicaSet:
		return &workload{kind: "ReplicaSet", name: o.Name, labels: o.Spec.Template.Labels, spec: &o.Spec.Template.Spec}
	case *corev1.Pod:
		return &workload{kind: "Pod", name: o.Name, labels: o.Labels, spec: &o.Spec}
	}
	return nil
}

// gatewaysOf finds the containers of a pod that mount a ConfigMap holding a
// Caddyfile.
func gatewaysOf(spec *corev1.PodSpec, caddyfiles map[string]*Caddyfile) []gateway {
	var gs []gateway
	for i := range spec.Containers {
		c := &spec.Containers[i]
		for _, m := range c.VolumeMounts {
			for _, v := range spec.Volumes {
				if v.Name != m.Name || v.ConfigMap == nil {
					continue
				}
				if cf, ok := caddyfiles[v.ConfigMap.Name]; ok {
					gs = append(gs, gateway{container: c, configMap: v.ConfigMap.Name, caddyfile: cf})
				}
			}
		}
	}
	return gs
}

// imagePinned reports an image reference that would float: no tag (which
// means latest) or the latest tag. A digest pins whatever the tag says.
func imagePinned(ref string) error {
	if name, digest, ok := strings.Cut(ref, "@"); ok {
		if name == "" || digest == "" {
			return fmt.Errorf("image %q: malformed digest reference", ref)
		}
		return nil
	}
	i := strings.LastIndexByte(ref, ':')
	if i < 0 || i < strings.LastIndexByte(ref, '/') {
		return fmt.Errorf("image %q has no tag, which pulls :latest; pin a version", ref)
	}
	if tag := ref[i+1:]; tag == "" || tag == "latest" {
		return fmt.Errorf("image %q is not pinned; name a version tag or a digest", ref)
	}
	return nil
}

func checkGateway(g gateway) []error {
	var problems []error
	problemf := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	c := g.container
	sitePorts := map[int]bool{}
	for _, s := range g.caddyfile.Sites {
		for _, p := range s.Ports {
			sitePorts[p] = true
		}
	}
	for _, probe := range []struct {
		kind  string
		probe *corev1.Probe
	}{{"readiness", c.ReadinessProbe}, {"liveness", c.LivenessProbe}} {
		if probe.probe == nil {
			problemf("no %s probe", probe.kind)
			continue
		}
		var port intstr.IntOrString
		switch h := probe.probe.ProbeHandler; {
		case h.HTTPGet != nil:
			port = h.HTTPGet.Port
		case h.TCPSocket != nil:
			port = h.TCPSocket.Port
		case h.GRPC != nil || h.Exec != nil:
			continue
		default:
			problemf("the %s probe has no handler", probe.kind)
			continue
		}
		n, err := containerPort(c, port)
		if err != nil {
			problemf("%s probe: %v", probe.kind, err)
		} else if !sitePorts[n] {
			problemf("%s probe: port %d is not a site of ConfigMap %s's Caddyfile", probe.kind, n, g.configMap)
		}
	}
	req, lim := c.Resources.Requests, c.Resources.Limits
	if req.Cpu().IsZero() {
		problemf("no CPU request")
	}
	if req.Memory().IsZero() {
		problemf("no memory request")
	}
	if lim.Memory().IsZero() {
		problemf("no memory limit")
	}
	return problems
}

// containerPort resolves a port by number or by the name of one of the
// container's ports.
func containerPort(c *corev1.Container, port intstr.IntOrString) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("container %s has no port named %q", c.Name, port.StrVal)
}

// checkService holds a Service reachable from outside the cluster to the
// gateway's API listeners.
func checkService(svc *corev1.Service, workloads []*workload) []error {
	spec := svc.Spec
	if spec.Type != corev1.ServiceTypeLoadBalancer && spec.Type != corev1.ServiceTypeNodePort && len(spec.ExternalIPs) == 0 {
		return nil
	}
	if len(spec.Selector) == 0 {
		return []error{errors.New("reachable from outside the cluster without a selector, so its endpoints cannot be checked")}
	}
	var problems []error
	selected := 0
	for _, w := range workloads {
		if !selects(spec.Selector, w.labels) {
			continue
		}
		selected++
		for _, sp := range spec.Ports {
			target := sp.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(sp.Port)
			}
			if err := exposable(w, target); err != nil {
				problems = append(problems, fmt.Errorf("port %d reachable from outside the cluster: %w", sp.Port, err))
			}
		}
	}
	if selected == 0 {
		problems = append(problems, errors.New("reachable from outside the cluster but selects no pod of this manifest"))
	}
	return problems
}

// exposable reports why a target port of a workload must not be reachable
// from outside the cluster, if it must not: it is not a port on which a
// gateway's Caddyfile proxies to engines (with its route check), or it is
// the admin port.
func exposable(w *workload, target intstr.IntOrString) error {
	if len(w.gateways) == 0 {
		return fmt.Errorf("%s is not a gateway (its own ports would be public)", w)
	}
	for _, g := range w.gateways {
		n, err := containerPort(g.container, target)
		if err != nil {
			continue
		}
		if admin, err := g.caddyfile.AdminListener(); err == nil && n == admin {
			return fmt.Errorf("%s: port %d is the admin API", w, n)
		}
		for _, r := range g.caddyfile.CheckRoutes() {
			if r.Proxies > 0 && slices.Contains(r.Site.Ports, n) {
				return nil
			}
		}
		return fmt.Errorf("%s: port %d is not a site of its Caddyfile that proxies to engines (metrics, health and admin listeners stay inside the cluster)", w, n)
	}
	return fmt.Errorf("%s: no gateway container has port %s", w, target.String())
}

// selects reports whether a Service selector matches a pod's labels.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}
