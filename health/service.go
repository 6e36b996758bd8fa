package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/types"
)

// Service is the health-check state of one Service.
type Service struct {
	Port           int32
	LocalEndpoints int
}

// ServiceServer runs one HTTP listener per healthCheckNodePort.
type ServiceServer struct {
	// bindIP is the address the listeners bind (default: all addresses).
	bindIP string
	// proxyHealthy reports whether kpr itself is healthy; a node whose proxy
	// is stuck must not attract traffic even if it has local endpoints.
	proxyHealthy func() bool
	log          *zap.Logger

	mu        sync.Mutex
	services  map[types.NamespacedName]Service
	listeners map[int32]*listener
}

type listener struct {
	service types.NamespacedName
	server  *http.Server
}

// NewServiceServer returns a ServiceServer binding bindIP ("" = all addresses).
func NewServiceServer(bindIP string, proxyHealthy func() bool, log *zap.Logger) *ServiceServer {
	if proxyHealthy == nil {
		proxyHealthy = func() bool { return true }
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &ServiceServer{bindIP: bindIP, proxyHealthy: proxyHealthy, log: log,
		services: map[types.NamespacedName]Service{}, listeners: map[int32]*listener{}}
}

// SyncServices makes the listeners match services: new ports are opened,
// ports no Service uses any more are closed, counts are updated in place.
// A port that cannot be opened is logged and retried on the next call.
func (s *ServiceServer) SyncServices(services map[types.NamespacedName]Service) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.services = services
	wanted := map[int32]types.NamespacedName{}
	for name, svc := range services {
		if svc.Port > 0 {
			wanted[svc.Port] = name
		}
	}
	for port, l := range s.listeners {
		if name, ok := wanted[port]; !ok || name != l.service {
			s.closeLocked(port)
		}
	}
	for port, name := range wanted {
		if _, ok := s.listeners[port]; ok {
			continue
		}
		if err := s.openLocked(port, name); err != nil {
			s.log.Warn("cannot serve a Service's healthCheckNodePort; will retry on the next sync",
				zap.Stringer("service", name), zap.Int32("port", port), zap.Error(err))
		}
	}
}

func (s *ServiceServer) openLocked(port int32, name types.NamespacedName) error {
	lis, err := net.Listen("tcp", net.JoinHostPort(s.bindIP, strconv.Itoa(int(port))))
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.handler(name), ReadHeaderTimeout: 5 * time.Second}
	s.listeners[port] = &listener{service: name, server: srv}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Warn("health check server stopped", zap.Int32("port", port), zap.Error(err))
		}
	}()
	return nil
}

func (s *ServiceServer) closeLocked(port int32) {
	if l, ok := s.listeners[port]; ok {
		l.server.Close()
		delete(s.listeners, port)
	}
}

// Close stops every listener.
func (s *ServiceServer) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for port := range s.listeners {
		s.closeLocked(port)
	}
}

// Run closes the listeners when ctx ends.
func (s *ServiceServer) Run(ctx context.Context) error {
	<-ctx.Done()
	s.Close()
	return nil
}

// serviceResponse is kube-proxy's health check body.
type serviceResponse struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (s *ServiceServer) handler(name types.NamespacedName) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		count := s.services[name].LocalEndpoints
		s.mu.Unlock()
		var body serviceResponse
		body.Service.Namespace, body.Service.Name = name.Namespace, name.Name
		body.LocalEndpoints = count
		body.ServiceProxyHealthy = s.proxyHealthy()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if count > 0 && body.ServiceProxyHealthy {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		if err := json.NewEncoder(w).Encode(body); err != nil {
			s.log.Debug("write health check answer", zap.Error(err))
		}
	})
}

// String is for logs.
func (s Service) String() string {
	return fmt.Sprintf("port %d, %d local endpoints", s.Port, s.LocalEndpoints)
}
