// A stand-in for the CUDA driver library (libcuda.so.1) that does no GPU work:
// every entry point gpupool's rows reach returns CUDA_SUCCESS at once, device
// and pinned memory come from aligned_alloc, streams get increasing ids, and
// every stream is idle and never capturing. It lets the CUDA backend's own
// code run where there is no GPU, to count its instructions
// (scripts/callgrind-rows.sh); its timings mean nothing, and nothing else
// should load it.
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
typedef int CUresult;
static int ctx_storage[4];
static __thread void* current_ctx = 0;
#define OK return 0
CUresult cuInit(unsigned f){OK;}
CUresult cuDriverGetVersion(int*v){*v=13000;OK;}
CUresult cuDeviceGetCount(int*c){*c=1;OK;}
CUresult cuDeviceGet(int*d,int o){*d=o;OK;}
CUresult cuDeviceGetAttribute(int*v,int a,int d){*v=1;OK;}
CUresult cuDeviceGetName(char*n,int l,int d){strncpy(n,"stub",l);OK;}
CUresult cuDevicePrimaryCtxRetain(void**c,int d){*c=&ctx_storage[d];OK;}
CUresult cuDevicePrimaryCtxRelease_v2(int d){OK;}
CUresult cuDevicePrimaryCtxGetState(int d,unsigned*f,int*a){*f=0;*a=1;OK;}
CUresult cuCtxGetCurrent(void**c){*c=current_ctx;OK;}
CUresult cuCtxSetCurrent(void*c){current_ctx=c;OK;}
CUresult cuCtxGetDevice(int*d){*d=0;OK;}
CUresult cuCtxSynchronize(void){OK;}
CUresult cuCtxGetStreamPriorityRange(int*l,int*g){*l=0;*g=-5;OK;}
CUresult cuGetErrorString(int e,const char**s){*s="stub error";OK;}
CUresult cuGetErrorName(int e,const char**s){*s="STUB";OK;}
static unsigned long long next_id=1;
struct stream { unsigned long long id; };
CUresult cuStreamCreate(void**s,unsigned f){struct stream*p=malloc(sizeof *p);p->id=__atomic_fetch_add(&next_id,1,0);*s=p;OK;}
CUresult cuStreamCreateWithPriority(void**s,unsigned f,int pr){return cuStreamCreate(s,f);}
CUresult cuStreamDestroy_v2(void*s){free(s);OK;}
CUresult cuStreamGetId(void*s,unsigned long long*id){*id=((uintptr_t)s<16)?(uintptr_t)s:((struct stream*)s)->id;OK;}
CUresult cuStreamGetCtx(void*s,void**c){*c=&ctx_storage[0];OK;}
CUresult cuStreamQuery(void*s){OK;}
CUresult cuStreamSynchronize(void*s){OK;}
CUresult cuStreamWaitEvent(void*s,void*e,unsigned f){OK;}
CUresult cuStreamIsCapturing(void*s,int*st){*st=0;OK;}
CUresult cuStreamGetCaptureInfo(void*s,int*st,unsigned long long*id){*st=0;if(id)*id=0;OK;}
CUresult cuStreamGetCaptureInfo_v2(void*s,int*st,unsigned long long*id,void**g,void**d,size_t*n){*st=0;if(id)*id=0;if(g)*g=0;if(d)*d=0;if(n)*n=0;OK;}
CUresult cuStreamGetCaptureInfo_v3(void*s,int*st,unsigned long long*id,void**g,void**d,void**e,size_t*n){*st=0;if(id)*id=0;if(g)*g=0;if(d)*d=0;if(e)*e=0;if(n)*n=0;OK;}
CUresult cuThreadExchangeStreamCaptureMode(int*m){OK;}
CUresult cuEventCreate(void**e,unsigned f){*e=malloc(16);OK;}
CUresult cuEventDestroy_v2(void*e){free(e);OK;}
CUresult cuEventRecord(void*e,void*s){OK;}
CUresult cuEventQuery(void*e){OK;}
CUresult cuEventSynchronize(void*e){OK;}
CUresult cuMemPoolCreate(void**p,const void*props){*p=malloc(8);OK;}
CUresult cuMemPoolDestroy(void*p){OK;}
CUresult cuMemPoolSetAttribute(void*p,int a,void*v){OK;}
CUresult cuMemPoolGetAttribute(void*p,int a,void*v){*(unsigned long long*)v=0;OK;}
CUresult cuMemPoolTrimTo(void*p,size_t k){OK;}
CUresult cuDeviceGetDefaultMemPool(void**p,int d){static char x;*p=&x;OK;}
CUresult cuMemAllocFromPoolAsync(unsigned long long*d,size_t n,void*p,void*s){*d=(uintptr_t)aligned_alloc(4096,(n+4095)&~(size_t)4095);OK;}
CUresult cuMemAllocAsync(unsigned long long*d,size_t n,void*s){*d=(uintptr_t)aligned_alloc(4096,(n+4095)&~(size_t)4095);OK;}
CUresult cuMemFreeAsync(unsigned long long d,void*s){free((void*)(uintptr_t)d);OK;}
CUresult cuMemAlloc_v2(unsigned long long*d,size_t n){*d=(uintptr_t)aligned_alloc(4096,(n+4095)&~(size_t)4095);OK;}
CUresult cuMemFree_v2(unsigned long long d){free((void*)(uintptr_t)d);OK;}
CUresult cuMemAllocManaged(unsigned long long*d,size_t n,unsigned f){*d=(uintptr_t)aligned_alloc(4096,(n+4095)&~(size_t)4095);OK;}
CUresult cuMemHostAlloc(void**p,size_t n,unsigned f){*p=aligned_alloc(4096,(n+4095)&~(size_t)4095);OK;}
CUresult cuMemFreeHost(void*p){free(p);OK;}
CUresult cuMemHostGetDevicePointer_v2(unsigned long long*d,void*p,unsigned f){*d=(uintptr_t)p;OK;}
CUresult cuMemcpyAsync(unsigned long long d,unsigned long long s,size_t n,void*st){memmove((void*)(uintptr_t)d,(void*)(uintptr_t)s,n);OK;}
CUresult cuMemcpyHtoDAsync_v2(unsigned long long d,const void*s,size_t n,void*st){memmove((void*)(uintptr_t)d,s,n);OK;}
CUresult cuMemcpyDtoHAsync_v2(void*d,unsigned long long s,size_t n,void*st){memmove(d,(void*)(uintptr_t)s,n);OK;}
CUresult cuMemsetD8Async(unsigned long long d,unsigned char v,size_t n,void*s){memset((void*)(uintptr_t)d,v,n);OK;}
